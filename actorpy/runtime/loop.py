"""A node's I/O loop: one thread polls the node's ROUTER, a wake-up socket, the monitor
sockets of watched links and watched file descriptors, and runs the node's ``tick`` (timers,
request deadlines, backlog flushes) after the I/O of each round.

The loop must never die silently: an error in a round is logged (throttled) and the loop
carries on. Only when rounds keep failing for ``FATAL_AFTER_S`` does it give up: it calls
``on_fatal(reason)`` so the process can exit and be restarted by its supervisor. Nothing is
imported lazily on these paths (an import opens files, which fails when file descriptors
run out).

Sockets the loop polls are owned by the loop's thread: other threads hand monitor sockets in
with ``adopt`` and back with ``release``; the loop registers, unregisters and closes them.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Callable

import zmq

from actorpy.log import Throttle

#: The longest wait one zmq poll takes: its timeout is a C int of milliseconds (24.8 days),
#: and past it pyzmq raises OverflowError (a request with timeout_s=1e7 failed every round
#: of the I/O loop until the loop gave up and the node with it); a later deadline waits on.
MAX_POLL_MS = 2**31 - 1

log = logging.getLogger(__name__)

#: consecutive failing rounds, for this long, make the loop give up
FATAL_AFTER_S = 10.0
_BACKOFF_MS = 100

#: ``let_run``: how long the loop may go without a round while a thread keeps the
#: interpreter busy, and how long that thread then waits for it at most
LET_RUN_AFTER_S = 0.002
LET_RUN_WAIT_S = 0.005


class SocketLoop:
    """The I/O thread of one node.

    Args:
        ctx: the node's ZeroMQ context.
        router: the node's bound ROUTER (owned by this loop from ``start`` on).
        name: the thread's name.
        on_router: drains the ROUTER (called when it is readable).
        tick: runs what is due; returns when it next wants to run (monotonic s) or None.
        on_fatal: called once with a reason if the loop has to give up.
    """

    def __init__(self, ctx: zmq.Context, router: zmq.Socket, name: str,
                 on_router: Callable[[], None], tick: Callable[[float], float | None],
                 on_fatal: Callable[[str], None]) -> None:
        self._router, self._on_router = router, on_router
        self._tick, self._on_fatal = tick, on_fatal
        self._wake_recv = ctx.socket(zmq.PAIR)
        self._wake_recv.linger = 0
        self._wake_recv.bind(f"inproc://wake-{id(self)}")
        self._wake_send = ctx.socket(zmq.PAIR)
        self._wake_send.linger = 0
        self._wake_send.connect(f"inproc://wake-{id(self)}")
        self._wake_lock = threading.Lock()
        self._handoff_lock = threading.Lock()
        self._adopted: list[tuple[zmq.Socket, Callable[[], None]]] = []
        self._released: list[zmq.Socket] = []
        self._fds: dict[int, Callable[[], None]] = {}
        self._sockets: dict[zmq.Socket, Callable[[], None]] = {}
        self._stopping = threading.Event()
        self._state = "new"  # "running", then "done" (guarded by the hand-off lock)
        self._throttle = Throttle(10.0)
        self._round_at = 0.0   # when the loop last went to poll (time.monotonic)
        self._yielders: deque[threading.Event] = deque()   # threads in let_run
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.on_teardown: Callable[[], None] | None = None
        #: runs on the loop's thread before it closes its sockets (stop socket monitors
        #: there: a monitor's PAIR must not close while its socket can still send events)
        self.before_teardown: Callable[[], None] | None = None

    # ------------------------------------------------------------- any thread
    def start(self) -> None:
        with self._handoff_lock:
            self._state = "running"
        self.thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self.wake()

    @property
    def running(self) -> bool:
        return self.thread.is_alive()

    def in_loop(self) -> bool:
        return threading.current_thread() is self.thread

    def let_run(self) -> None:
        """Give the loop the interpreter lock for a round, if it has gone without one for
        ``LET_RUN_AFTER_S``: called by a thread that may keep the interpreter busy between
        pieces of its work (one whose requests a service on this node answers on that
        thread, a worker beside its shard).

        Such a thread never blocks: it lets go of the lock briefly (a zmq call, a contended
        lock) and takes it back before a waiting thread wakes, and the loop, back from its
        poll with a message from another node, could wait for it for seconds (measured:
        0.45 s between a remote push leaving its worker and the loop taking it; a smaller
        switch interval did not help): a remote worker did 20 steps while the one beside
        its shard did up to 2 370 times as many. This wakes the loop and waits
        until it is back at its poll (at most ``LET_RUN_WAIT_S``), having handled what it
        had. It costs one round of the loop every ``LET_RUN_AFTER_S`` at most, none while
        the loop's own traffic keeps it going round."""
        if (time.monotonic() - self._round_at < LET_RUN_AFTER_S or self._state != "running"
                or self.in_loop()):
            return
        done = threading.Event()
        self._yielders.append(done)
        self.wake()
        done.wait(LET_RUN_WAIT_S)

    def wake(self) -> None:
        with self._wake_lock:
            try:
                self._wake_send.send(b"", zmq.NOBLOCK)
            except zmq.ZMQError:  # queue full (a wake-up is pending anyway) or closed
                pass

    def adopt(self, sock: zmq.Socket, callback: Callable[[], None]) -> None:
        """Poll ``sock`` from now on; ``callback()`` runs on the loop when it is readable."""
        with self._handoff_lock:
            if self._state == "done":
                sock.close(linger=0)
                return
            self._adopted.append((sock, callback))
        if not self.in_loop():
            self.wake()

    def release(self, sock: zmq.Socket) -> None:
        """Stop polling ``sock`` and close it (on the loop's thread, or here if it is gone)."""
        with self._handoff_lock:
            if self._state != "running":  # never polled, or the loop is gone: close here
                self._adopted = [(s, c) for s, c in self._adopted if s is not sock]
                sock.close(linger=0)
                return
            self._released.append(sock)
        if not self.in_loop():
            self.wake()

    def watch_fd(self, fd: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` once on the loop when ``fd`` becomes readable (or closes)."""
        with self._handoff_lock:
            self._fds[fd] = callback
        self.wake()

    # ------------------------------------------------------------- the loop's thread
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_recv, zmq.POLLIN)
        watched: set[int] = set()
        failing_since: float | None = None
        timeout_ms: int | None = 0
        try:
            while not self._stopping.is_set():
                try:
                    self._handoffs(poller, watched)
                    self._round_at = time.monotonic()
                    while self._yielders:
                        self._yielders.popleft().set()
                    events = dict(poller.poll(timeout_ms))
                    self._dispatch(events, poller, watched)
                    timeout_ms = self._run_tick()
                    failing_since = None
                except Exception as exc:  # the loop must survive anything a round raises
                    now = time.monotonic()
                    failing_since = failing_since or now
                    self._report(exc)
                    if now - failing_since > FATAL_AFTER_S:
                        self._give_up(f"the I/O loop failed for {FATAL_AFTER_S:.0f} s: "
                                      f"{type(exc).__name__}: {exc}")
                        return
                    timeout_ms = _BACKOFF_MS
        except BaseException as exc:  # e.g. MemoryError in the handler above: last resort
            self._give_up(f"the I/O loop died: {type(exc).__name__}: {exc}")
            raise
        finally:
            self._teardown(poller)

    def _handoffs(self, poller: zmq.Poller, watched: set[int]) -> None:
        with self._handoff_lock:
            adopted, self._adopted = self._adopted, []
            released, self._released = self._released, []
            fds = set(self._fds) - watched
        for sock, callback in adopted:
            self._sockets[sock] = callback
            poller.register(sock, zmq.POLLIN)
        for sock in released:
            if self._sockets.pop(sock, None) is not None:
                poller.unregister(sock)
            sock.close(linger=0)
        for fd in fds:
            poller.register(fd, zmq.POLLIN)
            watched.add(fd)

    def _dispatch(self, events: dict, poller: zmq.Poller, watched: set[int]) -> None:
        if self._wake_recv in events:
            while self._wake_recv.poll(0):
                self._wake_recv.recv()
        for sock, callback in list(self._sockets.items()):  # connection news first
            if sock in events:
                callback()
        if self._router in events:
            self._on_router()
        for fd in watched & set(events):
            with self._handoff_lock:
                callback = self._fds.pop(fd, None)
            poller.unregister(fd)
            watched.discard(fd)
            if callback is not None:
                callback()

    def _run_tick(self) -> int | None:
        due = self._tick(time.monotonic())
        if due is None:
            return None
        return min(max(0, int((due - time.monotonic()) * 1000) + 1), MAX_POLL_MS)

    def _report(self, exc: Exception) -> None:
        self._throttle.log(log, type(exc), "the I/O loop hit %s: %s; carrying on",
                           type(exc).__name__, exc, level=logging.ERROR, exc_info=True)

    def _give_up(self, reason: str) -> None:
        log.critical("%s; this node stops (restart it)", reason)
        try:
            self._on_fatal(reason)
        except Exception:
            log.exception("the fatal-error callback failed")

    def _teardown(self, poller: zmq.Poller) -> None:
        if self.before_teardown is not None:
            try:
                self.before_teardown()
            except Exception:  # noqa: BLE001 - the sockets must close all the same
                log.exception("stopping the socket monitors failed")
        with self._handoff_lock:
            self._state = "done"
            leftover = [s for s, _ in self._adopted] + self._released
            self._adopted, self._released = [], []
        for sock in [*self._sockets, *leftover]:
            sock.close(linger=0)
        self._sockets.clear()
        with self._wake_lock:
            for sock in (self._wake_recv, self._wake_send):
                sock.close(linger=0)
        if self.on_teardown is not None:
            self.on_teardown()

    def close_unstarted(self) -> None:
        """Release the loop's own sockets when its thread never ran."""
        self._teardown(zmq.Poller())
