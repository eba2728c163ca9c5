"""Liveness, decided without the GIL's help (pure: no sockets, no clock of its own).

A process that holds the GIL for seconds (a task in one long C call: ``sum(range(N))``,
sorting a big list, pickling a big object graph) cannot run its Python heartbeat timer, but
libzmq's own I/O thread (C, no GIL) still answers ZMTP pings and keeps its connections up.
A process that is killed closes its sockets (the peer sees a disconnect at once and every
reconnect is refused); one that is stopped (SIGSTOP) or cut off stops answering pings (the
pinging side drops the connection after ``ping_timeout_s``, and no reconnect handshake
succeeds). So:

* the **connection** of a watched link (the manager's link to each member, a member's link
  to the manager) is the primary signal: down for longer than ``link_grace_s`` means dead;
* **heartbeat silence** alone (the Python timer did not run) only makes a node *suspect*,
  and dead after ``silent_dead_after_s`` (a process stuck for good, e.g. deadlocked in C);
* silence is counted only while the observer itself was awake (``StallGuard``): a loop that
  was stalled does not blame its peers for what it could not hear.

Bounds with the defaults (heartbeat_interval_s=0.25, dead_after_s=2): a killed node is
declared dead ``link_grace_s`` (1 s) after its connection drops, plus up to one sweep; a
stopped one within ``ping_interval_s + ping_timeout_s + link_grace_s`` (2.25 s) plus a sweep,
i.e. ``dead_after_s + 2 * heartbeat_interval_s`` in all (``bound_s``).
"""
from __future__ import annotations

import enum
import errno
from dataclasses import dataclass

import zmq

_HANGUPS = frozenset({errno.EPIPE, errno.ECONNRESET})
#: handshakes the peer must cut off in a row before we call it an authentication failure
#: (one could be a peer dying at that very moment)
AUTH_HANGUPS = 2
#: how long every dial of a link never up must be refused before nothing is taken to listen
#: there: a manager started beside its workers (a script, a loaded machine) gets this long
#: to bind, and a wrong address is still said well before the 30 s join timeout
REFUSED_GRACE_S = 3.0


@dataclass(frozen=True)
class LivenessTimes:
    """The timings derived from a Config's ``heartbeat_interval_s``, ``dead_after_s`` and
    ``silent_dead_after_s`` (see the module docstring)."""

    heartbeat_interval_s: float
    ping_interval_s: float
    ping_timeout_s: float
    link_grace_s: float
    suspect_after_s: float
    silent_dead_after_s: float  # 0: never
    first_connect_s: float      # a link never up yet: dead after this long (handshakes of a
                                # process still starting, under load, can take seconds)

    @classmethod
    def of(cls, heartbeat_interval_s: float, dead_after_s: float,
           silent_dead_after_s: float = 0.0) -> LivenessTimes:
        return cls(heartbeat_interval_s=heartbeat_interval_s,
                   ping_interval_s=heartbeat_interval_s,
                   ping_timeout_s=dead_after_s / 2,
                   link_grace_s=dead_after_s / 2,
                   suspect_after_s=dead_after_s,
                   silent_dead_after_s=silent_dead_after_s,
                   first_connect_s=max(10.0, 5 * dead_after_s))

    @property
    def bound_s(self) -> float:
        """How long a stopped or unreachable node may take to be declared dead."""
        return self.ping_interval_s + self.ping_timeout_s + self.link_grace_s \
            + self.heartbeat_interval_s


class Verdict(enum.Enum):
    """What a link's monitor events can prove about the peer at once."""

    AUTH_FAILED = "auth"          # the peer refused our handshake: not our cluster's secret
    PROTOCOL_MISMATCH = "proto"   # the peer speaks another security mechanism
    NOT_LISTENING = "refused"     # never reached: every dial refused (or host unreachable)


class LinkWatch:
    """The state of one watched connection, fed with its socket-monitor events.

    >>> w = LinkWatch(now=0.0)
    >>> w.on_event(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0, now=0.1); w.down_for(5.0)
    0.0
    >>> w.on_event(zmq.EVENT_DISCONNECTED, 13, now=6.0); w.down_for(7.5)
    1.5
    """

    __slots__ = ("up", "since", "ever_up", "hangups", "verdict", "refused_since",
                 "refused_grace_s")

    def __init__(self, now: float, refused_grace_s: float = REFUSED_GRACE_S) -> None:
        self.up = False
        self.since = now        # when the current state (up or down) began
        self.ever_up = False
        self.hangups = 0
        self.verdict: Verdict | None = None
        #: since when no dial has reached a listener (None: the last one did)
        self.refused_since: float | None = now
        #: how long every dial must be refused before NOT_LISTENING (``REFUSED_GRACE_S``)
        self.refused_grace_s = refused_grace_s

    def on_event(self, event: int, value: int, now: float) -> Verdict | None:
        """Apply one monitor event; returns a verdict the first time one is proven."""
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.up, self.since, self.ever_up, self.hangups = True, now, True, 0
            self.verdict = None
        elif event == zmq.EVENT_DISCONNECTED:
            if self.up:
                self.up, self.since = False, now
        elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return self._prove(Verdict.AUTH_FAILED)
        elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            return self._prove(Verdict.PROTOCOL_MISMATCH)
        elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and value in _HANGUPS:
            # CURVE with a wrong secret: our HELLO is sealed for a server key the peer does
            # not hold; it cannot open it and hangs up mid-handshake. (A stopped peer lets
            # the handshake time out instead: EAGAIN.)
            self.hangups += 1
            if self.hangups >= AUTH_HANGUPS:
                return self._prove(Verdict.AUTH_FAILED)
        elif event == zmq.EVENT_CONNECTED:
            self.refused_since = None
        elif event == zmq.EVENT_CONNECT_RETRIED:
            # A retry with no CONNECTED since the last one: the TCP dial itself failed.
            # Once the link has been up, the peer died or restarts (judged by its downtime).
            if self.refused_since is None:
                self.refused_since = now
            elif not self.ever_up and now - self.refused_since >= self.refused_grace_s:
                return self._prove(Verdict.NOT_LISTENING)
        return None

    def _prove(self, verdict: Verdict) -> Verdict | None:
        first = self.verdict is None
        self.verdict = verdict
        return verdict if first else None

    def down_for(self, now: float) -> float:
        """Seconds the connection has been down (0 while it is up)."""
        return 0.0 if self.up else max(0.0, now - self.since)


class StallGuard:
    """Tells how long the observer's own loop was stalled, from a periodic tick.

    A tick due every ``interval_s`` that runs later than ``interval_s`` past its due time
    means the loop could not run (its thread was starved of the GIL); that stretch is
    returned so callers can leave it out of anyone's silence.

    >>> g = StallGuard(interval_s=0.25, now=0.0)
    >>> g.tick(0.25), g.tick(0.6), g.tick(10.6)
    (0.0, 0.0, 9.5)
    """

    def __init__(self, interval_s: float, now: float) -> None:
        self.interval_s = interval_s
        self._due = now + interval_s

    def tick(self, now: float) -> float:
        stalled = max(0.0, now - self._due - self.interval_s)
        self._due = now + self.interval_s
        return stalled


def judge(silent_s: float, down_s: float, times: LivenessTimes,
          ever_up: bool = True) -> tuple[str, str]:
    """A member's state from its heartbeat silence and its link's downtime (``ever_up``:
    whether the link was ever up; a first connection gets ``first_connect_s``).

    Returns ``(state, reason)`` with state ``"alive"``, ``"suspect"`` or ``"dead"``.

    >>> t = LivenessTimes.of(0.25, 2.0, 300.0)
    >>> judge(10.0, 0.0, t)[0], judge(0.5, 1.5, t)[0], judge(301.0, 0.0, t)[0]
    ('suspect', 'dead', 'dead')
    >>> judge(0.5, 5.0, t, ever_up=False)[0], judge(0.5, 11.0, t, ever_up=False)[0]
    ('alive', 'dead')
    """
    if not ever_up:
        if down_s > times.first_connect_s:
            return "dead", f"could not connect to it for {down_s:.1f} s (unreachable address?)"
    elif down_s > times.link_grace_s:
        return "dead", (f"connection lost for {down_s:.1f} s (the process was killed, stopped "
                        "or cut off)")
    if times.silent_dead_after_s and silent_s > times.silent_dead_after_s:
        return "dead", (f"no heartbeat for {silent_s:.1f} s although its connection is up "
                        "(stuck; see silent_dead_after_s)")
    if silent_s > times.suspect_after_s:
        return "suspect", (f"no heartbeat for {silent_s:.1f} s, connection up (busy holding "
                           "the GIL?)")
    return "alive", ""
