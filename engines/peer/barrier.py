"""Barrier checks over the overlay: draw peers, learn their steps, let the shared policy decide.

One check, for a peer that completed ``my_step`` steps:

1. **Draw**: PSP(β, s) draws β peers uniformly (``sample_peers``: free once the overlay's
   subtrees are cached); BSP/SSP/DSSP and custom policies enumerate every peer (``members``,
   also cached); ASP and PSP(0) draw nobody and advance at once.
2. **Steps**: each drawn peer's step comes from the messages it already sent us (piggy-backed,
   ``StepTable``). Steps only grow, so a known step that does not block us is still right; only
   the peers whose last known step *would* block us (and that we have not heard from since
   the check began) are PINGed, and their PONG carries their step. A peer that does not
   answer is evicted by the node and left out.
3. **Decide**: ``policy.decide(my_step, OverlayView(steps, population))``.

A blocked peer checks again later with a fresh draw (``PSP`` re-samples at each check, as in
the paper). ``records`` keeps every decision with the steps it saw, for tests and benches.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, cast

from actorpy.barrier import ASP, BSP, DSSP, PSP, SSP, Decision, Policy  # noqa: F401 (BSP: doctests)
from actorpy.ids import NodeId
from actorpy.values import as_decision

from .kademlia.events import Done, Effects, OpKind
from .kademlia.node import KademliaNode
from .kademlia.routing import Contact
from .view import OverlayView


@dataclass(frozen=True)
class CheckRecord:
    """One decision: when, at which step, the steps it saw, what it cost.

    Attributes:
        started_s: when the check began; at_s: when it was decided (node clock).
        my_step: the deciding peer's completed steps.
        seen: address -> step of every drawn peer used. decision: the policy's answer.
        pinged: peers asked for their step. rpcs: messages the draw itself sent.
    """

    started_s: float
    at_s: float
    my_step: int
    seen: dict[str, int]
    decision: Decision
    pinged: int
    rpcs: int


@dataclass
class _Check:
    my_step: int
    started_s: float
    draw_op: int | None = None
    pings: set[int] = field(default_factory=set)
    peers: list[Contact] = field(default_factory=list)
    pinged: int = 0
    rpcs: int = 0


def blocking_floor(policy: Policy, my_step: int) -> int:
    """The lowest step a peer may have without blocking ``my_step`` under ``policy``
    (custom policies: anyone behind us is worth asking).

    >>> blocking_floor(SSP(2), 10), blocking_floor(BSP(), 10), blocking_floor(PSP(4, 1), 10)
    (8, 10, 9)
    """
    if isinstance(policy, (SSP, PSP)):
        return my_step - policy.staleness
    if isinstance(policy, DSSP):
        return my_step - policy.low
    return my_step


#: how many updates of its own a step may miss by default (``pipeline_depth``): more runs
#: faster per step, but such stale updates cost convergence at a large learning rate (the
#: simulated linear regressions of tests/peer/test_job.py, lr 0.05, miss their targets with
#: 2 where 8-12 peers push; Job A of bench/peer.py, lr 0.002, takes as many updates with 4)
DEFAULT_DEPTH = 1


def pipeline_depth(policy: Policy, overlap: int = DEFAULT_DEPTH) -> int:
    """How many of its own steps' updates a peer under ``policy`` may leave unanswered when
    it begins a step (``overlap``: the job's wish; True is ``DEFAULT_DEPTH``): 0 for BSP,
    pBSP and custom policies, which wait for the answers; at most the staleness for SSP and
    PSP, ``low`` for DSSP. A step then reads values that miss at most that many updates of
    the peer's own, as a worker of ps-lite's bounded delay does.

    >>> [pipeline_depth(p) for p in (ASP(), PSP(1, 4), SSP(2), PSP(1, 0), BSP(), DSSP(1, 5))]
    [1, 1, 1, 0, 0, 1]
    >>> pipeline_depth(PSP(1, 4), 4), pipeline_depth(ASP(), 6), pipeline_depth(ASP(), False)
    (4, 6, 0)
    """
    depth = DEFAULT_DEPTH if overlap is True else int(overlap)
    if isinstance(policy, ASP):
        return depth
    if isinstance(policy, (SSP, PSP)):
        return min(policy.staleness, depth)
    if isinstance(policy, DSSP):
        return min(policy.low, depth)
    return 0


def balanced_batch(batch: float, lead: int, bound: int, floor: float, top: float) -> float:
    """The next step's batch of a balancing peer (``balance=True``) whose peers lead it by
    ``lead`` steps (the lower median of the steps it knows, less its own) under a staleness
    ``bound``: 5 % less per step of lead over half the bound, 5 % more per step short of it
    (-15 % / +10 % a step at most), within ``floor`` .. ``top``.

    A straggler the others press against (their lead near the bound: they wait on it, or
    soon will) so takes fewer samples until they lead it by half the bound, short of
    waiting; a peer level with the others keeps or regains the job's batch. The lower
    median, not the fastest peer: a peer merely behind the fastest one is no straggler, and
    shrinking it too would shrink all but the fastest. The floor (a quarter of the job's
    batch): with fewer samples updates get noisy enough to cost more updates than the speed
    gains.

    >>> round(balanced_batch(32.0, lead=4, bound=4, floor=8.0, top=32.0), 1)
    28.8
    >>> balanced_batch(16.0, lead=0, bound=4, floor=8.0, top=32.0)
    17.6
    """
    factor = min(1.10, max(0.85, 1.0 - 0.05 * (lead - bound / 2)))
    return min(top, max(floor, batch * factor))


class OverlayBarrier:
    """Runs barrier checks for one peer (see the module docstring).

    Args:
        node: the peer's Kademlia node (its step table, sampler and pings).
        policy: BSP(), SSP(s), ASP(), PSP(β, s), DSSP or any ``Policy``.
        rng: the peer's barrier rng (samples and subsets).
    """

    def __init__(self, node: KademliaNode, policy: Policy, rng: random.Random) -> None:
        self.node = node
        self.policy = policy
        self.rng = rng
        self.records: list[CheckRecord] = []
        #: called with each record as it is decided (a simulator compares it with the truth)
        self.observer: Callable[[CheckRecord], None] | None = None
        #: ``pushing(node_id, now)``: whether that peer pushes to us, so that its next push
        #: carries its next step (the runner wires its ``KeyOwner``'s); under a policy with
        #: staleness such a peer is not PINGed when it blocks us
        self.pushing: Callable[[int, float], bool] = lambda node_id, now: False
        self._check: _Check | None = None

    @property
    def is_checking(self) -> bool:
        return self._check is not None

    def owns(self, op_id: int) -> bool:
        """Whether ``op_id`` is one of the node operations this barrier started."""
        check = self._check
        return check is not None and (op_id == check.draw_op or op_id in check.pings)

    def check(self, my_step: int, now: float) -> tuple[Decision | None, Effects]:
        """Start a check; returns the decision at once when no message is needed, else None
        (the decision then comes from ``on_done``)."""
        policy = self.policy
        check = _Check(my_step, now)
        if isinstance(policy, ASP) or (isinstance(policy, PSP) and policy.sample == 0):
            return self._decide(check, now), Effects()
        self._check = check
        if isinstance(policy, PSP):
            picks = self.node.sample_cached(policy.sample, self.rng, now)
            if picks is not None:   # drawn from the cached membership: no operation to wait on
                eff = Effects()
                self._drawn(check, picks, now, eff)
                return self._absorb(check, eff, now)
            op_id, eff = self.node.sample_peers(policy.sample, self.rng, now)
        else:
            op_id, eff = self.node.members(self.rng, now)
        check.draw_op = op_id
        return self._absorb(check, eff, now)

    def on_done(self, done: Done, now: float) -> tuple[Decision | None, Effects]:
        """Feed the ``Done`` of an operation this barrier owns (see ``owns``)."""
        check = self._check
        assert check is not None
        eff = Effects()
        self._handle(check, done, now, eff)
        return self._absorb(check, eff, now)

    def _handle(self, check: _Check, done: Done, now: float, eff: Effects) -> None:
        if done.op_id == check.draw_op and done.kind in (OpKind.SAMPLE, OpKind.MEMBERS):
            check.draw_op = None
            check.rpcs += done.rpcs
            self._drawn(check, list(done.contacts), now, eff)
        else:
            check.pings.discard(done.op_id)

    def _drawn(self, check: _Check, peers: list[Contact], now: float, eff: Effects) -> None:
        """The draw gave ``peers``: PING those whose step is unknown or would block us."""
        check.peers = peers
        floor = blocking_floor(self.policy, check.my_step)
        for contact in check.peers:
            seen = self.node.steps.get(contact.node_id)
            # a known step that lets us pass is still right (steps only grow); ask only
            # the ones that would block us and were not heard from during this check.
            # With staleness, not one that pushes to us either: blocked, we are ahead
            # of it and it does not wait on us, so its next push (which brings its
            # step) is soon enough; a PING would cost four messages a wait (PING, PONG,
            # and its PING back once it moves, PONG). Without staleness it waits on us
            # next: we ask, so as to start our step as soon as it finished its own.
            if seen is None or (seen.step < floor and seen.seen_at <= check.started_s
                                and not (floor < check.my_step
                                         and self.pushing(contact.node_id, now))):
                op_id, ping = self.node.ping(contact, now)
                check.pings.add(op_id)
                check.pinged += 1
                eff.extend(ping)

    def _absorb(self, check: _Check, eff: Effects,
                now: float) -> tuple[Decision | None, Effects]:
        """Handle the Dones in ``eff`` that are ours (a cached draw finishes at once); decide
        when nothing is pending."""
        while eff.done:
            mine = [d for d in eff.done if self.owns(d.op_id)]
            if not mine:
                break
            eff.done = [d for d in eff.done if not self.owns(d.op_id)]
            for done in mine:
                self._handle(check, done, now, eff)
        if check.draw_op is None and not check.pings:
            return self._decide(check, now), eff
        return None, eff

    def _decide(self, check: _Check, now: float) -> Decision:
        self._check = None
        seen: dict[str, int] = {}
        for contact in check.peers:
            entry = self.node.steps.get(contact.node_id)   # gone peers were forgotten
            if entry is not None:
                seen[contact.address] = entry.step
        population = max(len(seen), round(self.node.size_estimate()) - 1)
        view = OverlayView(cast("dict[NodeId, int]", seen), population, self.rng)   # copied
        decision = as_decision(self.policy.decide(check.my_step, view))
        record = CheckRecord(check.started_s, now, check.my_step, seen, decision, check.pinged,
                             check.rpcs)
        self.records.append(record)
        if self.observer is not None:
            self.observer(record)
        return decision
