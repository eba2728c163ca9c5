"""Reading other workers' object stores: a whole block (``fetch``) or its items one segment
at a time (``fetch_iter``). Any node can fetch (workers and drivers); the worker holding the
block answers from its ``ObjectStore.serve`` on its I/O thread, without unpickling.
"""
from __future__ import annotations

from typing import Any, Iterator

from actorpy.errors import ProtocolError
from actorpy.ids import NodeId
from actorpy.runtime.node import Node
from actorpy.runtime.reply import ReplyFuture
from actorpy.runtime.store import HEAD, SegmentRequest, StreamHead
from actorpy.wire.kinds import CORE_SERVICE, Kind


def fetch(node: Node, dest: NodeId, key: str, *, timeout_s: float) -> Any:
    """The whole block under ``key`` on ``dest`` (waits at most ``timeout_s``)."""
    return node.call(dest, CORE_SERVICE, Kind.FETCH, key, timeout_s=timeout_s,
                     what=f"fetch of {key!r}")


def fetch_async(node: Node, dest: NodeId, key: str) -> ReplyFuture:
    """Ask ``dest`` for the whole block under ``key``; the future gives the value (a stream's
    items as one list), unpickled in the thread that calls ``result``."""
    return node.request(dest, CORE_SERVICE, Kind.FETCH, key, what=f"fetch of {key!r}")


def fetch_iter(node: Node, dest: NodeId, key: str, *, timeout_s: float) -> Iterator[Any]:
    """Yield the items of the block under ``key`` on ``dest``, one segment at a time.

    One request per segment, the next one already on its way while the current segment's
    items are yielded, so at most two segments are in memory. ``timeout_s`` bounds the wait
    for each segment (the reader's own pace is not limited). A block stored with ``put``
    arrives whole and its value's items are yielded.

    Raises:
        RemoteError: no such key on ``dest`` (KeyError there), or it was stored again or
            deleted while being read.
        ActorpyTimeout: a segment did not arrive within ``timeout_s``.
        NodeLost: ``dest`` died.
    """
    what = f"fetch of {key!r}"

    def ask(index: int, version: int) -> ReplyFuture:
        return node.request(dest, CORE_SERVICE, Kind.FETCH, SegmentRequest(key, index, version),
                            what=f"{what} (segment {index})" if index != HEAD else what)

    head_future = ask(HEAD, 0)
    pending: dict[int, ReplyFuture] = {}
    try:
        head = head_future.result(timeout_s)
        if not isinstance(head, StreamHead):
            raise ProtocolError(f"{dest} answered {what} with a {type(head).__name__}")
        if head.segments:
            pending[0] = ask(0, head.version)
        for index in range(head.segments):
            part = pending.pop(index).result(timeout_s)
            if index + 1 < head.segments:
                pending[index + 1] = ask(index + 1, head.version)
            if head.stream:
                yield from part
            else:
                try:
                    items = iter(part)
                except TypeError:
                    raise TypeError(f"{key!r} on {dest} holds a {type(part).__name__}, which "
                                    "is not iterable; read it with fetch()") from None
                yield from items
    finally:
        for future in pending.values():
            if not future.done():
                node.forget(future)
        if not head_future.done():
            node.forget(head_future)
