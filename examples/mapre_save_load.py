"""Save a dataset as text part files (part-00000 ..., _SUCCESS) and load it back."""
import os
import tempfile

import actorpy
from engines import mapre

with actorpy.connect(workers=2) as cluster, tempfile.TemporaryDirectory() as tmp:
    squares = mapre.from_items(cluster, range(1, 11), partitions=3).map(lambda x: f"{x}\t{x * x}")
    out = squares.save(os.path.join(tmp, "squares"), timeout_s=60)
    print("wrote", sorted(os.listdir(out)))
    back = mapre.load(cluster, out).map(lambda line: tuple(map(int, line.split("\t"))))
    print("read back", back.collect(timeout_s=60))
    print("sum of the squares:", back.map(lambda kv: kv[1]).fold(0, int.__add__, timeout_s=60))
