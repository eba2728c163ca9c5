"""The owner side of a P2P job: a peer serves GET and PUSH for the keys it is closest to.

An owner runs ``pull`` on each update pushed to it, writes the result locally with the next
clock and stores it on the key's ``replication`` closest peers, one replication round in
flight per key (writes made meanwhile go with the next). Another peer's push is acknowledged
once a round holding its write was taken by every holder it chose (*durable*), so it
survives the owner's death while one of those holders lives; the owner's own pushes go on
at once (*own updates*, below; with ``durable=False`` every push does: its write on the
holders within ``replicate_s``). When the pusher is the only other holder (and holds a
copy), the answer itself is its copy: it keeps the value it is answered with. The owner
remembers the clock each holder has and sends no round that would tell them nothing new;
a write nobody waits on (its own push's) goes with a round within ``replicate_s``. A round
sends no STORE to a holder whose push it answers or that holds the round's clock, but always
to one (a holder's fence judges every round; a pusher judges its answer so: ``fenced``).

Owner changes are serialised:

- **Take-over.** A peer that finds itself closest to a key (a closer peer it evicted silent
  for 10 rpc timeouts: ``waits.py``) answers MISSING (the pusher retries shortly) until it has
  fetched the newest copy from the key's holders (FIND_VALUE of the k closest, its own copy
  included). Asking them tells them of it, so from then on they refuse the old owner's writes
  (below), and the old owner, one of the k closest, learns of it too and stops taking writes:
  every write it applied before that is in the copy fetched, every one acknowledged on holders.
- **Fence.** A holder refuses an owner's write (a STORE whose writer is its sender, clock
  > 0) when it knows a peer closer to the key than that writer, itself included, or when
  its copy is another writer's and newer than the write's branch root (``Store.base``, the
  clock taken over: two owners at once, each having evicted the other); it answers with
  the version it holds, so the write's round is not durable. A round no other peer took is
  durable only for a peer that knows no other (``KademliaNode.alone``).
- **Stale owner.** A round refused by a holder means a closer peer has taken over: the pushes
  waiting on it are answered NOT_OWNER (their pushers look the owner up again), the local
  writes since its last durable round (or the take-over) are dropped (a branch the holders
  did not take; with ``durable`` that round's copy stays, the last replica of acknowledged
  writes maybe), and the key is taken over again before this peer serves it again, with no
  memory of the copies given in the lost branch (a newer copy we gave a holder is no refusal).
- **Exactly once.** A copy's stamps name each pusher's last step folded into it; an owner
  takes them with the copy, so a push that comes again is applied only if the copy lacks it.
- **Waits** (``waits.py``). A refused round's key is taken over again once the closer peer
  is found or gone; a peer alone keeps its own updates unsettled for ``wait_alone_s``.
- **Own updates.** The owner's own pushes, acknowledged at once, are kept until a durable
  round covers them (or the one other holder echoes the token of the answer it kept); if
  their copy loses they go to the key's owner again, with their steps and before our later
  pushes of it. Its runner ends once none are left.
"""
from __future__ import annotations

import logging
import traceback
from typing import Any, Callable

from .context import JobSpec, OwnerStore, Timer, fails_job
from .fence import Fence
from .kademlia.events import Done, Effects, SetTimer
from .kademlia.ids import KadId, key_id
from .kademlia.messages import Call
from .kademlia.node import KademliaNode
from .kademlia.routing import Contact
from .kademlia.values import MAX_STAMPS, Blob
from .methods import Method, Status
from .pipeline import Pushes, pushed_items
from .rounds import RoundWindow
from .waits import OwnerWaits

log = logging.getLogger(__name__)


Then = Callable[[Done, float, Effects], None]
StartOp = Callable[[tuple[int, Effects], Then, Effects], None]
Answer = tuple[int, tuple[Any, ...], Any]
#: ``later(answer, now, effects)``: how a deferred answer reaches the asker.
Later = Callable[[Answer, float, Effects], None]


class KeyOwner(Fence, OwnerWaits, RoundWindow):
    """Serves the keys one peer owns.

    Args:
        spec: the job (its ``pull``).
        node: the peer's node (its storage holds the keys).
        start_op: registers a node operation's continuation with the peer's runner, so its
            ``Done`` comes back here.

    Attributes:
        applied: updates folded in here, per key.
        owned: the keys this peer has taken over (fetched the newest copy of) and serves.
        error: the last ``pull`` failure here (type, message, traceback), if any.
    """

    def __init__(self, spec: JobSpec, node: KademliaNode, start_op: StartOp) -> None:
        self.spec = spec
        self.node = node
        self._start_op = start_op
        self.applied: dict[str, int] = {}
        self.error: tuple[str, str, str] | None = None
        self._replicating: dict[int, int] = {}      # key -> clock of the round in flight
        self._dirty: set[int] = set()
        self._init_rounds()                         # rounds waiting for room (``rounds.py``)
        self._adopting: set[int] = set()
        self._looking: set[int] = set()             # keys refused, looked up before adopting
        # key -> when its own updates began to wait for a partner (``_awaits_partner``)
        self._awaiting: dict[int, float] = {}
        # key -> what a refused round goes back to: the copy taken over, or our last durable one
        self._adopted: dict[int, Any] = {}
        self.owned: set[int] = set()                # keys taken over (newest copy fetched)
        self._queued: dict[int, list[tuple[Callable[[float, Effects], None], Later]]] = {}
        # key -> the acks waiting on a round: (clock of the write, pusher, answer)
        self._waiting: dict[int, list[tuple[int, int, Later]]] = {}
        # key -> pusher -> its last step folded into our copy (the copy's stamps, from the
        # copy taken over on)
        self._pushed: dict[int, dict[int, int]] = {}
        self._pushes: dict[int, tuple[float, float]] = {}   # pusher -> (last push, interval)
        # key -> holder -> the newest clock it holds: taken in a durable round, or answered
        # to its push (a holder keeps the value its push is answered with)
        self._copies: dict[int, dict[int, int]] = {}
        # key -> pusher -> the clock of the copy we answered its last push with, in this
        # take-over (a holder keeps it: a round's STORE arriving after it is no refusal)
        self._answered: dict[int, dict[int, int]] = {}
        self._later: dict[int, int] = {}            # replication timer token -> key
        # key -> (pusher, token, clock): the last answer that is its only other holder's copy
        # (``serve``), not known to have arrived yet
        self._proof: dict[int, tuple[int, int, int]] = {}
        self._base: dict[int, int] = {}             # key -> the clock taken over
        # key -> its last round was refused: False, or True once a lookup of it ended since
        self._refused: dict[int, bool] = {}
        # key -> our own pushes acknowledged at once whose write no holder confirmed yet:
        # (clock, name, step, update), pushed again through ``repush`` if that write is lost
        self._unsure: dict[int, list[tuple[int, str, int, Any]]] = {}
        #: ``repush(name, pushes, now, effects)``: push own updates again ((step, update)
        #: pairs in step order) to whoever owns their key now, before our later pushes of
        #: it (the runner wires it; None: own updates are not kept)
        self.repush: Callable[[str, Pushes, float, Effects], None] | None = None
        #: called when own updates became safe (the runner's end waits for it)
        self.settled: Callable[[], None] = lambda: None
        self._tokens = 0
        #: the model's keys' ids, hashed once (a push looks its key's id up several times)
        self._kids = {name: key_id(name) for name in spec.keys}
        node.accept_store = self.accept_store

    def kid(self, name: str) -> KadId:
        """``key_id(name)``, looked up for the model's keys."""
        kid = self._kids.get(name)
        return key_id(name) if kid is None else kid

    def on_call(self, sender: Contact, call: Call, now: float, eff: Effects) -> Answer | None:
        """The node's CALL handler: GET and PUSH for the keys this peer owns (None: a push
        answered once durable)."""
        if call.method not in (Method.GET, Method.PUSH) or not call.args \
                or type(call.args[0]) is not str or self.kid(call.args[0]) != call.key:
            return Status.ERROR, ("ProtocolError", "malformed P2P engine call"), None
        if (call.args[2] if len(call.args) > 2 else 0) != self.spec.run:
            # a call of this overlay's previous job (its node retried it after the job
            # ended): folded in here, it would change this job's model and, with its step,
            # make this job's pushes look like repeats (acknowledged, not applied)
            return Status.ERROR, ("StaleCall", "a call of another job"), None
        update = call.value.to_value() if call.value is not None else None
        items: tuple[tuple[int, Any], ...] = ()
        if call.method == Method.PUSH:
            if update is None:
                return Status.ERROR, ("ProtocolError", "PUSH without an update"), None
            step = call.args[1] if len(call.args) > 1 else -1
            token = call.args[3] if len(call.args) > 3 and type(call.args[3]) is int else -1
            items = pushed_items((step, *call.args[4:]) if len(call.args) > 4 else step,
                                 update)
            if not items:
                return Status.ERROR, ("ProtocolError", "malformed PUSH batch"), None
            last = self._pushes.get(sender.node_id)
            self._pushes[sender.node_id] = (now, now - last[0] if last else float("inf"))
        def later(answer: Answer, when: float, e: Effects) -> None:
            e.sends.append(self.node.answer_call(sender, call, answer))
        return self.serve(sender, call.args[0], call.key, Method(call.method), items, now, eff,
                          later, token if items else -1)

    def pushing(self, node_id: int, now: float) -> bool:
        """Whether ``node_id`` pushes to us (twice at least) and its next push (its step) is
        not overdue: at most twice its last interval (or ``poll_s``) since its last one."""
        last = self._pushes.get(node_id)
        return last is not None and now - last[0] <= max(2 * last[1], self.spec.poll_s) \
            and last[1] != float("inf")

    def serve(self, sender: Contact, name: str, kid: KadId, method: Method,
              items: tuple[tuple[int, Any], ...], now: float, eff: Effects,
              later: Later, token: int = -1) -> Answer | None:
        """Serve a GET (``items`` empty) or a PUSH of ``items``, (step, update) pairs in step
        order (a pipelined pusher's batch; one, mostly; step -1: none); a PUSH is answered
        through ``later`` once durable (None returned), anything else at once. ``token``:
        the one the pusher echoes from the last answer it kept as its copy (-1: none)."""
        if self.node.leaving:
            # our keys are being handed on: a write taken now would miss the copy handed
            # over; the pusher retries and, once our LEAVE reached it, asks the next owner
            return Status.MISSING, (), None
        if not self._is_owner(kid):
            self.owned.discard(kid)
            self._refused.pop(kid, None)        # a refusal explained: the closer peer known
            self._unsettled(kid, now, eff)      # to the new owner before our next push
            return Status.NOT_OWNER, (), None
        record = self.node.storage.get(kid, now)
        if (kid not in self.owned or record is None) and self._holding(kid, now, eff):
            return Status.MISSING, (), None
        if kid not in self.owned or record is None:
            def again(when: float, e: Effects) -> None:
                got = self.serve(sender, name, kid, method, items, when, e, later, token)
                if got is not None:
                    later(got, when, e)
            self._queued.setdefault(kid, []).append((again, later))
            self._adopt(kid, now, eff)
            return None                 # served once the key is taken over
        if method == Method.GET:                # (the stamps are for holders alone)
            return Status.OK, (record.clock,), record.value.stamped(())
        mine = sender.node_id == self.node.node_id
        proof = self._proof.get(kid)
        if proof is not None and proof[0] == sender.node_id and token == proof[1]:
            self._settled(kid, proof[2])        # it holds the copy we answered it with
        done = self._pushed.get(kid, {}).get(sender.node_id, -1)
        fresh = [(step, update) for step, update in items if step < 0 or step > done]
        if not fresh:
            # the same push again (its first answer came after the pusher's timeout and the
            # node asked again): applied once, answered once its write is durable
            self._waiting.setdefault(kid, []).append((record.clock, sender.node_id, later))
            self._replicate(kid, now, eff)
            return None
        wrote = False
        for step, update in fresh:
            failed, wrote_key = self._fold(sender, name, kid, step, update, mine, now, eff)
            if failed is not None:
                return failed
            wrote = wrote or wrote_key
        record = self.node.storage.get(kid, now)
        assert record is not None
        if not wrote or mine or not self.spec.durable:
            # our own update needs no wait: if we die before it is on the holders, it is
            # lost with the only peer that saw it acknowledged (without ``durable``, so is
            # another peer's); ``_fold`` kept it for ``repush`` meanwhile
            if not mine:
                self._answered.setdefault(kid, {})[sender.node_id] = record.clock
            return Status.OK, (record.clock,), record.value
        holders = self.node.holders_of(kid, now)
        if holders is not None and sender.node_id in self._copies.get(kid, {}) \
                and all(h.node_id == sender.node_id for h in holders):
            # the pusher is the only other holder and holds a copy: the answer is its new
            # copy (it keeps it), so the write needs no round. Our own updates in it are
            # safe once it holds that copy, which its next push proves by echoing the
            # answer's token; else a round does (``_replicate``)
            self._copies[kid][sender.node_id] = record.clock
            self._tokens += 1
            self._proof[kid] = (sender.node_id, self._tokens, record.clock)
            return Status.OK, (record.clock, self._tokens), record.value
        self._waiting.setdefault(kid, []).append((record.clock, sender.node_id, later))
        self._replicate(kid, now, eff)
        return None

    def _fold(self, sender: Contact, name: str, kid: KadId, step: int, update: Any,
              mine: bool, now: float, eff: Effects) -> tuple[Answer | None, bool]:
        """Run ``pull`` on one update and write what it set, each key with its next clock.
        Returns the ERROR answer if ``pull`` raised (nothing written then), and whether it
        wrote ``name``."""
        read = lambda n: ((r.value.to_value(), r.clock)  # noqa: E731
                          if (r := self.node.storage.get(self.kid(n), now)) is not None else None)
        store = OwnerStore(read, sender.address, step, folding=name)
        try:
            self.spec.pull(store, {name: update})
        except BaseException as exc:  # user code: the pusher fails with it
            if not fails_job(exc):
                raise
            self.error = (type(exc).__qualname__, str(exc), traceback.format_exc())
            log.error("peer %s: pull of %s failed: %s", self.node.address, name, exc)
            return (Status.ERROR, (type(exc).__qualname__, str(exc)[:200]), None), False
        if step >= 0:
            pushed = self._pushed.setdefault(kid, {})
            pushed.pop(sender.node_id, None)        # the latest pusher last (stamps)
            pushed[sender.node_id] = step
        for key, value in store.written.items():
            written = self.kid(key)
            held = self.node.storage.get(written, now)
            clock = 0 if held is None else held.clock + 1
            # each pusher's last step folded in (of the latest MAX_STAMPS pushers: a push of
            # one left out may be applied again after a take-over)
            stamps = tuple(self._pushed[kid].items())[-MAX_STAMPS:] if written == kid \
                and kid in self._pushed else held.value.stamps if held is not None else ()
            self.node.storage.put(written, Blob.of(value).stamped(stamps), now,
                                  self.node.config.ttl_s, is_origin=True, clock=clock,
                                  writer=self.node.node_id)
            if written != kid or mine or not self.spec.durable:
                # nobody waits on this write: it goes to the holders with a round at most
                # ``replicate_s`` from now, or with an answer to a holder's push before that
                self._replicate_later(written, eff)
        self.applied[name] = self.applied.get(name, 0) + 1
        if mine and name in store.written and self.spec.durable:
            # until our own write is on the holders, we keep the update: should the write
            # not make it (a closer peer took the key over meanwhile), it is pushed again
            record = self.node.storage.get(kid, now)
            assert record is not None
            self._unsure.setdefault(kid, []).append((record.clock, name, step, update))
        return None, name in store.written

    def on_timer(self, token: int, now: float) -> Effects:
        """A ``_replicate_later`` timer is due: replicate its key, unless nothing is new."""
        eff, kid = Effects(), self._later.pop(token, None)
        if kid is not None:
            self._replicate(KadId(kid), now, eff)
        return eff

    def _replicate_later(self, kid: KadId, eff: Effects, delay_s: float | None = None) -> None:
        if kid in self._later.values():
            return
        self._tokens += 1
        self._later[self._tokens] = kid
        eff.timers.append(SetTimer(self.spec.replicate_s if delay_s is None else delay_s,
                                   Timer.REPLICATE, self._tokens))

    def _covered(self, kid: KadId, clock: int, now: float) -> bool:
        """Whether every holder of ``kid`` has (or was answered with) a copy at ``clock``."""
        holders = self.node.holders_of(kid, now)
        copies = self._copies.get(kid, {})
        return holders is not None and (bool(holders) or not self._wants_holders(now)) \
            and all(copies.get(h.node_id, -1) >= clock for h in holders)

    def _wants_holders(self, now: float) -> bool:
        """Whether a write must be on another peer to be safe: keys have copies on more
        peers than one, and this one knows others (``KademliaNode.alone``)."""
        return self.node.config.copies > 1 and not self.node.alone(now)

    def _settled(self, kid: KadId, clock: int) -> None:
        """Every holder of ``kid`` took our copy at ``clock``: own updates up to it are safe."""
        proof = self._proof.get(kid)
        if proof is not None and proof[2] <= clock:
            del self._proof[kid]
        unsure = self._unsure.get(kid)
        if unsure:
            unsure[:] = [u for u in unsure if u[0] > clock]
            self.settled()

    def unsure(self) -> bool:
        """Whether an own update of ours, acknowledged at once, is on no other holder yet."""
        return any(self._unsure.values())

    def _unsettled(self, kid: KadId, now: float, eff: Effects) -> None:
        """Our copy of ``kid`` lost to another (a refused round, or a newer copy fetched): the
        own updates no holder confirmed may be lost with it, so they are pushed again, with
        their steps, to the key's owner now: applied there unless the copy it holds has them
        (its stamps), never lost."""
        self._proof.pop(kid, None)
        unsure = sorted(self._unsure.pop(kid, []), key=lambda u: u[2])
        if unsure and self.repush is not None:
            self.repush(unsure[0][1], tuple((step, update) for _, _, step, update in unsure),
                        now, eff)

    def _adopt(self, kid: KadId, now: float, eff: Effects) -> None:
        """Take a key over: fetch the newest copy among its holders (ours included), which
        also tells them of us (the fence), before serving it."""
        if kid in self._adopting:
            return
        self._adopting.add(kid)

        def fetched(done: Done, when: float, e: Effects) -> None:
            self._adopting.discard(kid)
            earlier = self._queued.pop(kid, [])     # served after own updates pushed again
            held = self.node.storage.get(kid, when)
            if done.blob is not None and (held is None or done.clock > held.clock):
                self.node.storage.put(kid, done.blob, when, self.node.config.ttl_s,
                                      is_origin=True, clock=done.clock, writer=KadId(0))
                held = self.node.storage.get(kid, when)
                self._unsettled(kid, when, e)       # another copy replaced ours
            if held is not None:                    # the root of our branch from now on
                self._base[kid] = held.clock
            if held is not None and self._is_owner(kid):
                # the pushes folded into the copy fetched are the ones its stamps name
                # (what we applied before, a refused round's writes, may not be in it: a
                # push seen then and not named is applied again if it comes again); every
                # holder's copy is unknown until a round or an answer tells
                self._pushed[kid] = dict(held.value.stamps)
                self._copies.pop(kid, None)
                self._proof.pop(kid, None)
                self._answered.pop(kid, None)
                self._adopted[kid] = held
                self.owned.add(kid)
                self._replicate(kid, when, e)
            for again, later in self._queued.pop(kid, []) + earlier:
                if kid in self.owned:
                    again(when, e)              # served now (or NOT_OWNER if that changed)
                else:                           # not found (yet), or no longer ours
                    later((Status.MISSING, (), None), when, e)
        self._start_op(self.node.get(kid, now, newest=True), fetched, eff)

    def _replicate(self, kid: KadId, now: float, eff: Effects) -> None:
        """Store the newest local copy on the key's closest peers; one round at a time. A
        durable round answers the pushes whose writes it holds; a refused one answers every
        waiting push NOT_OWNER and drops the key (taken over again before it is served)."""
        if kid in self._replicating:
            self._dirty.add(kid)
            return
        if self._defer(kid):            # too many rounds in flight: it goes once one ends
            return
        record = self.node.storage.get(kid, now)
        if record is None:
            return
        if kid not in self.owned and kid not in self._adopting \
                and record.writer != self.node.node_id:
            # a round due after the key moved on: ``set`` would relabel the owner's copy as
            # ours, and lose its writes when refused (docs/peer.md, item 7)
            for _, _, later in self._waiting.pop(kid, []):
                later((Status.NOT_OWNER, (), None), now, eff)
            return
        clock = record.clock
        if not self._waiting.get(kid) and self._covered(kid, clock, now) \
                and not (kid in self._awaiting and self._awaits(kid, now)):
            proof = self._proof.get(kid)
            if proof is None or not self._unsure.get(kid):
                if self._awaiting.pop(kid, None) is not None:
                    # waited wait_alone_s for a partner: our own updates are safe as they
                    # can be (before: left unsure, and a peer whose stop said so never DONE)
                    self._settled(kid, clock)
                return              # the holders' copies are as new: nothing to send
            if self.pushing(proof[0], now):
                self._replicate_later(kid, eff)     # its next push will prove its copy
                return
            # it stopped pushing: a round (a STORE to it, at least) confirms our updates
        skip = self._skip(kid, clock, now)

        def replicated(done: Done, when: float, e: Effects) -> None:
            del self._replicating[kid]
            waiting = self._waiting.pop(kid, [])
            gave = (self._copies.get(kid, {}), self._answered.get(kid, {}))
            # a holder that answers with a newer copy we gave it (the answer to its own
            # push, sent after this round's STORE and arrived before it) holds all of this
            # round's write: not a refusal, and it counts as confirmed
            ours = all(writer == self.node.node_id and held > clock
                       and any(g.get(c.node_id) == held for g in gave)
                       for c, held, writer in done.refusals)
            answered = sum(1 for c in done.stored_on if c.node_id != self.node.node_id)
            durable = done.durable or (ours and answered == done.asked)
            # a round no other peer took holds the write on us alone: durable only for a peer
            # that knows no other (a table emptied by false evictions found none; they may
            # hold a newer branch, which the next round's holders' fence tells us of)
            only_here = not done.asked and not skip and self._wants_holders(when)
            durable = durable and not only_here
            if done.refused and not ours:
                log.info("peer %s: a holder of key %s refused our write: a closer peer took "
                         "it over", self.node.address, kid)
                self.owned.discard(kid)
                self._refused[kid] = False
                self._dirty.discard(kid)
                for _, _, later in waiting:
                    later((Status.NOT_OWNER, (), None), when, e)
                adopted, held = self._adopted.pop(kid, None), self.node.storage.get(kid, when)
                if self.spec.durable and (held is None or held.writer == self.node.node_id):
                    # our writes since our last durable round are a branch the holders did not
                    # take: the acknowledged ones (our own) are pushed again (below), so they are
                    # dropped, and the take-over fetches theirs, never ours instead. We go back to
                    # that round's copy (else the one taken over), never further: it may be the last
                    # replica of acknowledged writes (its other holders dead since). Another
                    # owner's copy, STOREd on us since, is none of our branch: it stays
                    self.node.storage.drop(kid)
                    if adopted is not None:
                        self.node.storage.put(kid, adopted.value, when, self.node.config.ttl_s,
                                              True, adopted.clock, adopted.writer)
                self._unsettled(kid, when, e)
                return
            if durable:
                if answered:            # on another peer: its writes are never dropped
                    self._adopted[kid] = record
                copies = self._copies.setdefault(kid, {})
                for holder in done.stored_on:
                    copies[holder.node_id] = max(clock, copies.get(holder.node_id, -1))
                held = self.node.storage.get(kid, when)
                assert held is not None
                done_now = [w for w in waiting if w[0] <= clock]
                waiting = [w for w in waiting if w[0] > clock]
                for _, pusher, later in done_now:
                    if pusher in skip:      # sent no STORE: it keeps this answer instead
                        copies[pusher] = max(held.clock, copies.get(pusher, -1))
                    later((Status.OK, (held.clock,), held.value), when, e)
                # a skipped holder counts only at the clock it holds (answered or before)
                if all(copies.get(h, -1) >= clock for h in skip) \
                        and not self._awaits_partner(kid, done.asked or bool(skip), when, e):
                    self._settled(kid, clock)
            elif only_here:         # ask the peers lost lately, and go again
                e.extend(self.node.probe_lately(when))
                self._replicate_later(kid, e, self.node.config.rpc_timeout_s)
            else:
                self._dirty.add(kid)            # a holder did not answer: go again
            if waiting:
                self._waiting[kid] = waiting
            if kid in self._dirty:
                self._dirty.discard(kid)
                self._replicate(kid, when, e)
        def ended(done: Done, when: float, e: Effects) -> None:
            replicated(done, when, e)
            self._next_rounds(when, e)
        self._replicating[kid] = clock
        self._start_op(self.node.set(kid, record.value, now, clock=clock, skip=skip,
                                     base=self._base.get(kid, -1)), ended, eff)
