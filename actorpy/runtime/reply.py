"""A reply on its way: a Future that unpickles in the waiting thread, not the I/O thread."""
from __future__ import annotations

import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from actorpy.errors import ActorpyError, ActorpyTimeout, ProtocolError
from actorpy.ids import NodeId
from actorpy.runtime import remote
from actorpy.wire.kinds import CORE_SERVICE, Kind


class ReplyFuture(Future):
    """A reply on its way. ``result()`` unpickles it in the calling thread and raises
    ``RemoteError`` when the remote side failed."""

    #: the id the request travelled under (set by ``Node.request``; 0 if never sent)
    request_id: int = 0

    def __init__(self, dest: NodeId, what: str, io_thread: threading.Thread | None = None) -> None:
        super().__init__()
        self.dest = dest
        self.what = what
        self._io_thread = io_thread
        self._lock = threading.Lock()
        self._decoded = False
        self._value: Any = None

    def result(self, timeout: float | None = None) -> Any:
        if not self.done() and threading.current_thread() is self._io_thread:
            raise ActorpyError(f"waiting for {self.what} on the node's I/O thread would deadlock: "
                               "handlers and node-lost listeners must not block")
        try:
            msg = super().result(timeout)
        except (TimeoutError, FutureTimeout):  # distinct classes before Python 3.11
            if self.done():  # the request's own deadline passed (set_exception): keep its words
                raise
            raise ActorpyTimeout(f"{self.what} on {self.dest} got no reply within {timeout} s; "
                                 "raise the timeout_s, or check the node's log") from None
        with self._lock:
            if not self._decoded:
                if msg.kind == Kind.ERROR and msg.header.service == CORE_SERVICE:
                    failure = msg.payload()
                    if not isinstance(failure, remote.RemoteFailure):
                        raise ProtocolError(f"{self.dest} answered {self.what} with a "
                                            f"malformed error ({type(failure).__name__})")
                    raise remote.rebuild(failure)
                self._value = msg.payload()
                self._decoded = True
        return self._value
