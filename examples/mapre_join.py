"""Join two datasets on their keys, as PySpark does: (k, v) join (k, w) -> (k, (v, w))."""
import actorpy
from engines import mapre

orders = [("ann", "tea"), ("bob", "coffee"), ("ann", "cake"), ("dan", "water")]
people = [("ann", "Oslo"), ("bob", "Lima"), ("cat", "Rome")]

with actorpy.connect(workers=2) as cluster:
    o = mapre.from_items(cluster, orders, partitions=2)
    p = mapre.from_items(cluster, people, partitions=2)
    for name, (item, city) in sorted(o.join(p).collect(timeout_s=60)):
        print(f"{name} ordered {item} in {city}")
    # left_join keeps every order; the ones with nobody to match get None
    strangers = o.left_join(p).filter(lambda kv: kv[1][1] is None).keys()
    print("orders from people we do not know:", strangers.collect(timeout_s=60))
