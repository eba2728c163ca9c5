"""One peer's training loop as a sans-I/O state machine over its ``KademliaNode``.

Each step: ``schedule`` -> fetch the keys it names (once; afterwards every push's reply
carries the key's new value) -> ``push`` computes updates -> each update goes to its key's
*owner*, the peer closest to the key (a CALL; the owner runs ``pull`` and answers with the new
value and clock) -> the step is done -> ``stop``? -> the barrier decides whether to go on.
Under a policy with staleness the next steps compute while a step's pushes travel
(``barrier.pipeline_depth``): their updates wait and go to each owner together, as one
batch, once those are answered (one batch per key out at most, so owners fold them in order).

The owner side (GET / PUSH, ``pull``, replicas): ``owner.py``; calls to owners: ``calls.py``.
"""
from __future__ import annotations

import logging
import random
import traceback
from typing import Any, Callable

import numpy as np

from actorpy.barrier import Decision
from actorpy.values import family, yes_or_no

from .barrier import OverlayBarrier, balanced_batch, pipeline_depth
from .calls import OwnerCalls, Phase
from .context import (JobSpec, PeerContext, Timer, balance_bound, checked_updates, fails_job,
                      read_own, scheduled_keys)
from .kademlia.events import Done, Effects, SetTimer
from .kademlia.ids import key_id
from .kademlia.node import KademliaNode
from .kademlia.steps import FINISHED
from .kademlia.values import Blob
from .methods import Method, Status
from .owner import KeyOwner
from .pipeline import Pipeline, Pushes

log = logging.getLogger(__name__)


class PeerRunner(OwnerCalls):
    """Runs ``spec`` on one peer.

    Args:
        spec: the job.
        node: this peer's Kademlia node (the runner installs itself as its CALL handler).
        index: this peer's index (seeds its rngs; ``PeerContext.index``).
        data: what ``push`` finds in ``ctx.data``.
        compute_s: simulated compute time of a step, ``compute_s(index, step)`` (None: none;
            a real shell leaves it None since the time is really spent).
    """

    def __init__(self, spec: JobSpec, node: KademliaNode, index: int, data: Any = None,
                 compute_s: Callable[[int, int], float] | None = None) -> None:
        super().__init__(spec, node)
        self.index = index
        self.data = data
        self.compute_s = compute_s
        self.rng = np.random.default_rng([spec.seed, index])
        self.barrier = OverlayBarrier(node, spec.policy, random.Random(spec.seed * 7919 + index))
        self.phase = Phase.IDLE
        self.step = 0
        self.first_step: int | None = None  # the step it began at (a joiner: caught up to)
        self.values: dict[str, tuple[Any, int]] = {}
        self.pushed = 0
        self.waits = 0
        self.finished_s: float | None = None           # when stop() said so
        self.error: tuple[str, str, str] | None = None  # (type, message, traceback)
        self.waiting_on: frozenset[str] = frozenset()
        #: this step's batch (``ctx.batch_size``); with ``spec.balance`` it moves with the
        #: lead of the peers ahead (``_rebalance``)
        self.batch = float(spec.batch)
        self._bound = balance_bound(spec.policy) if spec.balance else None
        self._floor = max(1.0, spec.batch / 4)
        self._epoch = 0
        self._keys: list[str] = []
        self._updates: dict[str, Any] = {}
        self._outstanding: set[str] = set()
        #: the next steps compute while a batch of pushes travels (``pipeline.py``); a peer
        #: ``stop`` ended is DONE once all its updates are answered (``_finishing``)
        self._pipe = Pipeline(pipeline_depth(spec.policy, spec.overlap))
        self._overlap = self._pipe.depth > 0
        self._read_own = self._pipe.depth > 1     # a step reads its own pending updates
        self._finishing = False
        self._answering = False         # inside a message another peer awaits an answer to
        self._sending = False           # this call's effects hold pushes not sent yet
        #: set by a shell while it handles a message on its node's I/O thread: a step is
        #: then begun and computed from timers (on the service's thread), never there
        self.on_io_thread = False
        #: set by a shell whose I/O thread may serve other peers while ``push`` runs:
        #: ``unlocked(work)`` runs ``work`` so (``ServiceContext.unlocked``); the runner's
        #: messages are handed to it on the I/O thread meanwhile (``computing``)
        self.unlocked: Callable[[Callable[[], Any]], Any] | None = None
        self._computing = False
        self.owner = KeyOwner(spec, node, self._start_op)
        node.on_call = self.owner.on_call
        self.owner.repush = self._repush
        for name, nbytes in spec.sizes.items():     # our requests wait for them at once
            node.sizes.note(self.owner.kid(name), nbytes)
        self.owner.settled = self._finish
        self.barrier.pushing = self.owner.pushing

    # ------------------------------------------------------------------ shell-facing
    def owns(self, op_id: int) -> bool:
        """Whether a node ``Done`` belongs to this runner (the ``Peer`` routes it here)."""
        return op_id in self._ops or self.barrier.owns(op_id)

    def start(self, now: float, catch_up: bool = False) -> Effects:
        """Begin working. ``catch_up``: a peer joining a running job first takes the highest
        step among the peers it finds, so it neither holds the others back nor races ahead."""
        eff = Effects()
        self.phase = Phase.WORKING
        if not catch_up:
            self.node.step = self.first_step = 0
            self._begin_step(now, eff)
            return eff

        def found(done: Done, when: float, e: Effects) -> None:
            known = [s.step for c in done.contacts
                     if (s := self.node.steps.get(c.node_id)) is not None
                     and s.step != FINISHED]
            self.step = self.first_step = max(known, default=0)
            self.node.step = self.step
            if not self._stopped(when):     # caught up with peers that are done: so is it
                self._begin_step(when, e)

        self._start_op(self.node.members(random.Random(self.index), now), found, eff)
        return eff

    def stop(self) -> None:
        """Stop for good (its peer leaves): no step begins, no computed update is pushed and
        no push is retried from now on; the answers to pushes in flight are taken, nothing
        follows them. (A failed runner stays FAILED.)"""
        if self.phase != Phase.FAILED:
            self.phase = Phase.DONE

    @property
    def answered(self) -> int:
        """Steps whose pushes were all answered: ``step``, less those whose pushes travel or
        wait (``pipeline_depth``; a peer that died then lost them unacknowledged)."""
        return self.step - self._pipe.unanswered

    @property
    def awaits_answers(self) -> bool:
        """A computed step waits for the pushes out to be answered (the pipeline is full):
        a shell may hand their answers to this runner on its node's I/O thread, so that the
        step's own pushes leave at once; the step is counted, and the next one computed, on
        the service's thread (``Timer.SENT``: ``stop`` and the barrier are user code)."""
        return self._pipe.full and self.phase == Phase.WORKING

    @property
    def computing(self) -> bool:
        """The service's thread runs user ``push`` (``unlocked``): a shell may hand this
        runner any message on its node's I/O thread meanwhile, answers included; a step
        they let begin or count waits for a timer, on the service's thread."""
        return self._computing

    @property
    def stopped(self) -> bool:
        """DONE or FAILED: nothing this runner does from now on may start a step or a push."""
        return self.phase in (Phase.DONE, Phase.FAILED)

    def seed_model(self, init: dict[str, Any], now: float) -> Effects:
        """Store the initial model (clock 0) on the keys' closest peers."""
        eff = Effects()
        for name, value in init.items():
            self._start_op(self.node.set(key_id(name), value, now, clock=0),
                           lambda d, t, e: None, eff)
        return eff

    def on_done(self, done: Done, now: float) -> Effects:
        """A node operation this runner started has finished."""
        eff = Effects()
        if self.barrier.owns(done.op_id):
            self._barrier(lambda: self.barrier.on_done(done, now), now, eff)
            return eff
        then = self._ops.pop(done.op_id, None)
        if then is not None:
            then(done, now, eff)
        return eff

    def on_timer(self, kind: Timer, token: int, now: float) -> Effects:
        """A runner timer is due."""
        eff = Effects()
        if kind == Timer.COMPUTED and token == self._epoch and self.phase == Phase.WORKING:
            self._push_all(now, eff)
        elif kind == Timer.RECHECK and token == self._epoch and self.phase == Phase.BARRIER:
            self._check_barrier(now, eff)
        elif kind == Timer.BEGIN and token == self._epoch and not self.stopped:
            self._begin_step(now, eff)
        elif kind == Timer.COMPUTE and token == self._epoch and self.phase == Phase.WORKING:
            self._compute(now, eff)
        elif kind == Timer.SENT and token == self._epoch and self.phase == Phase.WORKING:
            self._step_done(now, eff)
        elif kind == Timer.REPLICATE:
            eff.extend(self.owner.on_timer(token, now))
        elif kind == Timer.RETRY:
            retry = self._retries.pop(token, None)
            if retry is not None and not self.stopped:
                retry(now, eff)
        return eff

    def peer_advanced(self, now: float, answered: bool = False) -> Effects:
        """We heard that some peer's step went up: a blocked barrier checks again now rather
        than at its next poll. ``answered``: the message's answer is already out, so a step
        the check allows begins here."""
        eff = Effects()
        if self.phase == Phase.BARRIER and self.waiting_on and not self.barrier.is_checking:
            # heard on a message that may await our answer (a push): unless it is out, the
            # step begins after it (a timer due at once), or the answer would wait for our
            # compute
            answering, self._answering = self._answering, not answered
            try:
                self._check_barrier(now, eff)
            finally:
                self._answering = answering
        return eff

    # ------------------------------------------------------------------ the step loop
    def _ctx(self) -> PeerContext:
        return PeerContext(self.node.address, self.index, self.step, self.rng, self.data,
                           max(1, round(self.node.size_estimate())), round(self.batch))

    def _rebalance(self) -> None:
        """Balanced batches without a coordinator (``balanced_batch``): the lead is how far
        the lower median of the steps this peer knows is ahead of its own. The steps come
        with the messages peers exchange anyway: nothing more on the wire."""
        assert self._bound is not None
        steps = sorted(seen.step for _, seen in self.node.steps.items()
                       if seen.step != FINISHED)
        if steps:
            lead = steps[(len(steps) - 1) // 2] - self.step
            self.batch = balanced_batch(self.batch, lead, self._bound, self._floor,
                                        float(self.spec.batch))

    def _begin_step(self, now: float, eff: Effects) -> None:
        if self.on_io_thread or self._serving_here or self._answering or self._sending:
            # From a timer due at once, not from here: on the node's I/O thread, so that
            # user code runs on the service's thread; inside a push this peer served itself,
            # or a peer that owns every key it works on would run all its steps in one call
            # (deep recursion) and its shell would serve no other message meanwhile; on
            # another peer's message, so that our answer to it goes out first; right after
            # an overlapped step's pushes, so that they go out before this step computes
            # (the effects of this call are sent once it returns). Otherwise
            # (an owner's reply, a PONG, a re-check) at once: a timer would cost the shell
            # a hop through its event loop.
            eff.timers.append(SetTimer(0.0, Timer.BEGIN, self._epoch))
            return
        self._epoch += 1
        self.phase = Phase.WORKING
        if self._bound is not None:
            self._rebalance()
        try:
            self._keys = scheduled_keys(self.spec.schedule(self._ctx()), self.spec.keys)
        except BaseException as exc:  # user code, or what it returned: the job fails with it
            if not fails_job(exc):
                raise
            self._fail(exc)
            return
        missing = [k for k in dict.fromkeys(self._keys) if k not in self.values]
        self._outstanding = set(missing)
        for name in missing:    # in schedule's order: a set's would change with the hash seed
            self._fetch(name, now, eff)
        if not self._outstanding:
            self._compute(now, eff)

    def _fetch(self, name: str, now: float, eff: Effects) -> None:
        def got(status: Status, clock: int, value: Any, when: float, e: Effects) -> None:
            if status == Status.OK:
                self.values[name] = (value.to_value(), clock)
                self._outstanding.discard(name)
                if not self._outstanding:
                    self._compute(when, e)
            elif not self.stopped:
                self._retry(lambda t, ef: self._fetch(name, t, ef), status, when, e)
        self._ask(name, Method.GET, None, now, eff, got)

    def _compute(self, now: float, eff: Effects) -> None:
        if self.stopped:        # the last fetch came back after the peer left (or failed)
            return
        if self.on_io_thread:   # user code runs on the service's thread
            eff.timers.append(SetTimer(0.0, Timer.COMPUTE, self._epoch))
            return
        values = {k: self.values[k][0] for k in self._keys}
        if self._read_own and self._pipe.busy:
            values = self._own_view(values)
        ctx, push = self._ctx(), self.spec.push
        try:
            self._computing = True
            try:
                out = push(ctx, values) if self.unlocked is None \
                    else self.unlocked(lambda: push(ctx, values))
            finally:
                self._computing = False
            if self.stopped:    # failed or left meanwhile (a message the I/O thread took)
                return
            self._updates = checked_updates(out, values, self.node.address)
        except BaseException as exc:  # user code: report it, as a task failure would be
            if not fails_job(exc):
                raise
            self._fail(exc)
            return
        delay = self.compute_s(self.index, self.step) if self.compute_s is not None else 0.0
        if delay > 0:
            eff.timers.append(SetTimer(delay, Timer.COMPUTED, self._epoch))
        else:
            self._push_all(now, eff)

    def _own_view(self, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` with this peer's updates not answered yet folded in (``read_own``);
        as they are, from now on, if ``pull`` cannot run on a private view."""
        try:
            view = read_own(self.spec.pull, self.values, self._pipe.pending(),
                            self.node.address)
        except BaseException as exc:  # user code: the owners' pull is what counts
            if not fails_job(exc):
                raise
            self._read_own = False
            log.info("peer %s: pull cannot fold this peer's own updates into its view "
                     "(%s: %s); its steps read the values as last answered",
                     self.node.address, type(exc).__qualname__, exc)
            return values
        return {k: view[k] for k in values}

    def _push_all(self, now: float, eff: Effects) -> None:
        if self._overlap:
            self._push_overlapped(now, eff)
            return
        self._outstanding = set(self._updates)
        if not self._outstanding:
            self._step_done(now, eff)
            return
        for name, update in list(self._updates.items()):
            self._push(name, ((self.step, update),), now, eff)

    def _push_overlapped(self, now: float, eff: Effects) -> None:
        """Queue this step's updates, send them unless a batch travels, and count the step
        done while the pipeline has room: the next one computes meanwhile, on values that
        miss at most the pipeline's depth of this peer's own updates, which the policy's
        staleness allows (``pipeline_depth``)."""
        stacks = all(family(value) is not None for value, _ in self.values.values())
        room = self._pipe.queue(self.step, self._updates, stacks)
        if not self._pipe.travelling:
            self._send_batch(now, eff)
        if room:                    # else done once its updates go (``_landed``)
            self._done_sending(now, eff)

    def _done_sending(self, now: float, eff: Effects) -> None:
        sending, self._sending = self._sending, True
        try:
            self._step_done(now, eff)
        finally:
            self._sending = sending

    def _send_batch(self, now: float, eff: Effects) -> None:
        """Send the waiting steps' updates, each key's in one push, in step order."""
        for name, pushes in self._pipe.take().items():
            self._push(name, pushes, now, eff)

    def _landed(self, name: str, now: float, eff: Effects) -> None:
        """A pipelined push was answered: once the whole batch is, the waiting updates go as
        the next batch, and a peer ``stop`` ended is DONE once none are left."""
        if not self._pipe.landed(name) or self.stopped:
            return
        if self._pipe.waiting:
            self._send_batch(now, eff)
            if self._pipe.release():
                if self.on_io_thread:
                    eff.timers.append(SetTimer(0.0, Timer.SENT, self._epoch))
                else:
                    self._done_sending(now, eff)
        self._finish()      # (a batch of steps that updated nothing sends nothing)

    def _push(self, name: str, pushes: Pushes, now: float, eff: Effects) -> None:
        """Push ``name``'s updates of one step or more ((step, update) pairs, in order);
        after own updates of ``name`` pushed again, once those are answered (``_repush``)."""
        if name in self._backlog:
            self._held.setdefault(name, []).append(pushes)
            return

        def acked(status: Status, clock: int, value: Any, when: float, e: Effects) -> None:
            if status == Status.OK:
                self.pushed += 1
                self.values[name] = (value.to_value(), clock)
                self._keep_copy(name, value, clock, when, e)
                if self._overlap:
                    self._landed(name, when, e)
                    return
                self._outstanding.discard(name)
                if not self._outstanding:
                    self._step_done(when, e)
            elif not self.stopped:
                self._retry(lambda t, ef: self._push(name, pushes, t, ef), status, when, e)
        self._ask_push(name, pushes, acked, now, eff)

    def _keep_copy(self, name: str, value: Blob, clock: int, now: float, eff: Effects) -> None:
        """A holder of a key keeps the value an owner answered its push with (its stamps
        too): the write's replica when it is the owner's only other holder (``owner.py``);
        were we serving the key, we take it over again (``Fence.replaced``)."""
        kid = self.owner.kid(name)
        held = self.node.storage.get(kid, now)
        owner = self.owners.get(name)
        if held is not None and owner is not None and clock > held.clock:
            self.node.storage.put(kid, value, now, self.node.config.ttl_s, clock=clock,
                                  writer=owner.node_id)
            self.owner.replaced(kid, now, eff)

    def _step_done(self, now: float, eff: Effects) -> None:
        if self.stopped:
            # its last pushes were answered after the peer began to leave (or after another
            # failed): a step begun now would push, retry and PING after the peer's LEAVE,
            # and a peer that hears from it again takes it back as the owner of its keys,
            # whose requests then wait for the rpc timeout (a leaver is silent)
            return
        self.step += 1
        self.node.step = self.step
        stopped = self._stopped(now)
        watchers = self.node.take_watchers()
        for watcher in watchers:
            # it asked for our step while ahead of us: a STEP tells it the new one (or that
            # we stopped), so a barrier waiting on us re-checks now, not at its next poll
            eff.sends.append(self.node.tell_step(watcher))
        if stopped:
            return
        self.phase = Phase.BARRIER
        # told, a watcher computes its step beside ours: a step begun here waits for a timer
        # (the STEP would leave after our compute, and the two peers' steps of a BSP job
        # took turns instead of running side by side)
        sending, self._sending = self._sending, self._sending or bool(watchers)
        try:
            self._check_barrier(now, eff)
        finally:
            self._sending = sending

    def _check_barrier(self, now: float, eff: Effects) -> None:
        self._barrier(lambda: self.barrier.check(self.step, now), now, eff)

    def _barrier(self, check: Callable[[], tuple[Decision | None, Effects]], now: float,
                 eff: Effects) -> None:
        """Run a step of a barrier check; act on its decision, if it made one."""
        try:
            decision, more = check()
        except BaseException as exc:  # a custom policy's decide is user code: the peer fails
            if not fails_job(exc):    # with it, as with any callback, rather than its handler
                raise                 # dying and the run hanging until its timeout_s
            self._fail(exc)
            return
        eff.extend(more)
        if decision is not None:
            self._decided(decision, now, eff)

    def _decided(self, decision: Decision, now: float, eff: Effects) -> None:
        if self.phase != Phase.BARRIER:
            return
        if decision.advance:
            self.waiting_on = frozenset()
            self._begin_step(now, eff)
        else:
            self.waits += 1
            self.waiting_on = frozenset(decision.waiting_on)
            eff.timers.append(SetTimer(self.spec.poll_s, Timer.RECHECK, self._epoch))

    def _stopped(self, now: float) -> bool:
        """Whether ``stop`` says this peer is done (then DONE, or once its overlapped
        pushes are answered: ``_landed``), or raised (then FAILED)."""
        try:
            stop = self.spec.stop(self._ctx())
            if stop is None:   # a missing `return`: it would never stop, until the timeout
                raise TypeError("stop returned None; it must return True (stop) or False "
                                "(go on)")
            stop = yes_or_no(stop, "stop")
        except BaseException as exc:
            if not fails_job(exc):
                raise
            self._fail(exc)
            return True
        if stop:
            self.finished_s = now
            # others learn it from our next messages, or from a PING when they wait on us:
            # their stops may say otherwise, and a barrier waiting on a peer that stopped
            # would wait for good
            self.node.step = FINISHED
            self._finishing = True  # still WORKING until its pushes land (``_finish``)
            self.phase = Phase.WORKING
            self._finish()
        return stop

    def _finish(self) -> None:
        """A peer ``stop`` ended is DONE once every update of its is answered, and those it
        applied as a key's owner are on another holder (or pushed again and answered): its
        job may end then, with nothing of its own still to land."""
        if self._finishing and not self._pipe.busy and not self._backlog \
                and not self.owner.unsure():
            self._finishing = False
            self.phase = Phase.DONE

    def _fail(self, exc: BaseException) -> None:
        self.error = (type(exc).__qualname__, str(exc), traceback.format_exc())
        self.phase = Phase.FAILED
        log.error("peer %s: job %s failed: %s", self.node.address, self.spec.name, exc)
