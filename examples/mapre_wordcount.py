"""Word count in the fluent style, map-reduce's hello world
(python examples/mapre_wordcount.py [FILES])."""
import operator
import sys

import actorpy
from engines import mapre

paths = sys.argv[1:] or [__file__]  # with no arguments, count the words of this script
with actorpy.connect(workers=2) as cluster:
    top = (mapre.load(cluster, paths)
           .flat_map(str.split).map(str.lower).filter(str.isalpha)
           .map(lambda w: (w, 1))
           .reduce_by_key(operator.add)
           .top(8, key=lambda kv: kv[1], timeout_s=60))
for word, n in top:
    print(f"{n:4d}  {word}")
