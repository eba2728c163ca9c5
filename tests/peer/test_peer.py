"""A Peer (node + runner) is what a shell drives: hostile engine calls end as an ERROR reply or
a ProtocolError, shell operations' Dones reach the shell, the runner's never do."""
from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actorpy.barrier import ASP
from actorpy.errors import ProtocolError
from engines.peer import Job, Peer
from engines.peer.kademlia.ids import KadId, key_id
from engines.peer.kademlia.events import Done, Effects, OpKind, TimerKind
from engines.peer.kademlia.messages import Call, FindNode, FindValue, Nodes, Reply, Step, Store
from engines.peer.kademlia.node import KademliaNode
from engines.peer.kademlia.rpc import PROTOCOL_VERSION, decode, encode, value_frames
from engines.peer.kademlia.values import Blob
from engines.peer.kademlia.routing import Contact
from engines.peer.owner import Method, Status
from engines.peer.runner import PeerRunner, Phase, Timer

EVIL = KadId(0xE << 150)


def counting_job() -> Job:
    job = Job("count", barrier=ASP(), replication=1)    # a push is durable once applied
    job.register_schedule(lambda ctx: ["n"])
    job.register_push(lambda ctx, values: {"n": np.ones(1)})
    job.register_pull(lambda store, up: store.set("n", store.get("n")[0] + up["n"]))
    job.register_stop(lambda ctx: ctx.step >= 3)
    return job


def lone_owner(run: int = 0) -> Peer:
    """A peer alone on its overlay, holding key "n" and serving it (taken over)."""
    node = KademliaNode(KadId(1), "me", counting_job().config, rng=random.Random(0))
    node.storage.put(key_id("n"), Blob.of(np.zeros(1)), 0.0, 3600.0)
    runner = PeerRunner(dataclasses.replace(counting_job().spec(), run=run), node, 0)
    runner.owner.owned.add(key_id("n"))
    return Peer(node, runner)


def reply_to(peer: Peer, call: Call, settle: bool = False, now: float = 1.0) -> Reply:
    """Send ``call`` from EVIL and return the owner's reply; a push is answered once its
    write is durable, so EVIL (now in the owner's table) answers the owner's lookups
    (``settle``: those after the reply too, so the owner's round ends)."""
    wire, frames = encode(call), [bytes(f) for f in value_frames(call)]
    eff = peer.receive("evil", wire, now=now, frames=frames)
    replies: list[Reply] = []
    for _ in range(10):
        replies += [s.message for s in eff.sends if isinstance(s.message, Reply)]
        asked = [s.message for s in eff.sends if isinstance(s.message, (FindNode, FindValue))]
        if (replies and not settle) or not asked:
            break
        eff = Effects()
        for ask in asked:
            eff.extend(peer.receive("evil", Nodes(ask.rpc_id, EVIL, ()), now=now))
    assert len(replies) == 1
    return replies[0]


class TestLineageFence:
    """A holder refuses an owner's write whose branch lacks the copy it holds (two owners
    at once, each having evicted the other): ``KeyOwner.accept_store``, ``Store.base``."""

    @pytest.mark.parametrize("held, base, taken", [
        ((2, 7), 0, False),         # our copy is another writer's, newer than its root
        ((2, 7), 1, False),
        ((2, 7), 2, True),          # its branch grew from our copy (or one at its clock:
                                    # each taker stores the copy it took under its name)
        ((1, 7), 2, True),          # ours is older than its root
        ((2, 7), -1, True),         # no lineage (a seed, a copy passed on)
        ((2, None), 0, True),       # our copy is that writer's own
        ((2, 0), 0, True),          # ... or of no writer (a copy taken over)
    ])
    def test_a_write_is_refused_when_its_branch_lacks_our_copy(self, held, base, taken):
        peer = lone_owner()
        assert peer.runner is not None
        kid = key_id("n")
        writer = KadId(kid ^ 1)                 # closer to the key than us: no other fence
        clock, held_writer = held
        peer.node.storage.put(kid, Blob.of(np.zeros(1)), 0.0, 3600.0, clock=clock,
                              writer=writer if held_writer is None else KadId(held_writer))
        store = Store(1, writer, kid, Blob.of(np.ones(1)), 60.0, clock=3, writer=writer,
                      base=base)
        assert peer.runner.owner.accept_store(Contact(writer, "w"), store, 1.0,
                                              Effects()) is taken


class TestExactlyOnce:
    """A copy carries each pusher's last step folded into it (its value's stamps): an owner
    that takes the key over takes them with it, so a push that comes again after an owner
    change (its answer lost, or its round refused) is applied only if the copy lacks it."""

    def taking_over(self, stamps: tuple) -> Peer:
        """A peer alone on its overlay whose copy of "n" (5.0, clock 5) has ``stamps``; it
        takes "n" over (fetches the newest copy: its own) when the first call comes."""
        node = KademliaNode(KadId(1), "me", counting_job().config, rng=random.Random(0))
        node.storage.put(key_id("n"), Blob.of(np.full(1, 5.0)).stamped(stamps), 0.0, 3600.0,
                         clock=5, writer=KadId(9))
        return Peer(node, PeerRunner(counting_job().spec(), node, 0))

    def test_a_push_the_copy_taken_over_holds_is_acknowledged_not_applied(self) -> None:
        peer = self.taking_over(((EVIL, 5),))
        assert peer.runner is not None
        reply = reply_to(peer, Call(1, EVIL, 2, key_id("n"), ("n", 5), np.ones(1)))
        assert reply.status == Status.OK and reply.value is not None
        assert reply.value.to_value().tolist() == [5.0] and peer.runner.owner.applied == {}
        reply = reply_to(peer, Call(2, EVIL, 2, key_id("n"), ("n", 6), np.ones(1)))
        assert reply.status == Status.OK and reply.value is not None
        assert reply.value.to_value().tolist() == [6.0] and reply.value.stamps == ((EVIL, 6),)
        assert peer.runner.owner.applied == {"n": 1}

    def test_a_push_the_copy_lacks_is_applied_and_stamped_beside_the_others(self) -> None:
        peer = self.taking_over(((KadId(7), 9), (EVIL, 4)))
        reply = reply_to(peer, Call(1, EVIL, 2, key_id("n"), ("n", 5), np.ones(1)))
        assert reply.status == Status.OK and reply.value is not None
        assert reply.value.to_value().tolist() == [6.0]
        assert reply.value.stamps == ((KadId(7), 9), (EVIL, 5))
        # a GET's answer leaves the stamps out (they are for the key's holders)
        got = reply_to(peer, Call(2, EVIL, 1, key_id("n"), ("n",)))
        assert got.value is not None and got.value.stamps == ()


    def test_a_copy_another_writer_stores_on_an_owner_is_taken_over_before_it_is_served(
            self) -> None:
        """Two owners at once (each evicted the other, a loaded machine): W, closer to the
        key, folded EVIL's step 6 and stored it on us; we took that copy (ours was W's: our
        take-over's round put our name on it at the same clock, which a higher writer id
        wins) and, W evicted again, served EVIL's step 6 once more from what we knew when
        we took the key over (its step 5 last): folded twice (a real 3-peer job under load
        ended with a key at 91 for 90). An owner whose copy another writer replaced takes
        the key over again, with that copy's stamps, before serving it (W silent for 10 rpc
        timeouts since its eviction: before that, the key is not taken over at all)."""
        kid = key_id("n")
        w = KadId(kid ^ 1)                      # closer to the key than us
        peer = self.taking_over(((EVIL, 5),))
        peer.node.storage.put(kid, Blob.of(np.full(1, 5.0)).stamped(((EVIL, 5),)), 0.0,
                              3600.0, clock=5, writer=w)
        assert peer.runner is not None
        got = reply_to(peer, Call(1, EVIL, 1, kid, ("n",)), settle=True)   # we take "n" over
        assert got.status == Status.OK and kid in peer.runner.owner.owned
        assert peer.node.storage.get(kid, 1.0).writer == w     # (5, us) < (5, w)
        store = Store(2, w, kid, Blob.of(np.full(1, 6.0)).stamped(((EVIL, 6),)), 60.0,
                      clock=6, writer=w, base=5)
        peer.receive("w", store, now=1.0)
        assert peer.node.storage.get(kid, 1.0).clock == 6      # taken: ours was W's
        peer.node.drop_contact("w", 1.0)                        # evicted again
        reply = reply_to(peer, Call(3, EVIL, 2, kid, ("n", 6), np.ones(1)))
        assert reply.status == Status.MISSING and kid not in peer.runner.owner.owned
        later = 1.0 + 11 * peer.node.config.rpc_timeout_s      # W silent since
        reply = reply_to(peer, Call(4, EVIL, 2, kid, ("n", 6), np.ones(1)), now=later)
        assert reply.status == Status.OK and reply.value is not None
        assert reply.value.to_value().tolist() == [6.0]         # not 7.0
        assert peer.runner.owner.applied == {}


def test_a_peer_knows_the_models_sizes_before_it_reads_a_key() -> None:
    """A read of a size never seen waits for a small answer, and its retry for the largest
    value a key may hold (1 GiB: minutes at the default allowance): a peer whose first GET
    was lost (a cut link) waited 172 s. The job's spec carries each key's bytes, and a
    runner notes them on its node."""
    spec = counting_job().spec({"n": np.zeros(1000, np.float32), "b": b"abc"})
    assert spec.sizes == {"n": 4000, "b": 3} and spec.keys == {"n", "b"}
    node = KademliaNode(KadId(1), "me", counting_job().config, rng=random.Random(0))
    assert node.sizes.expected(key_id("n"), None) is None
    PeerRunner(spec, node, 0)
    assert node.sizes.expected(key_id("n"), None) == 4000
    assert node.sizes.expected(key_id("b"), None) == 3


class TestEngineCalls:
    def test_push_to_the_owner_runs_pull(self) -> None:
        peer = lone_owner()
        reply = reply_to(peer, Call(7, EVIL, 2, key_id("n"), ("n", 0), np.ones(1)))
        assert reply.status == Status.OK and reply.args == (1,)
        assert reply.value is not None and reply.value.to_value().tolist() == [1.0]
        assert peer.runner is not None and peer.runner.owner.applied == {"n": 1}

    def test_a_call_of_another_run_is_refused_and_changes_nothing(self) -> None:
        """Standalone peers serve one job after another: a push of the job before, retried
        by its node after that job ended, was folded into the next job's model, and its step
        made that job's own pushes up to it look like repeats (acknowledged, never applied;
        seen as 150 pushes, 119 updates after a Ctrl-C'd p2p-sgd --bootstrap)."""
        peer = lone_owner(run=7)
        stale = reply_to(peer, Call(1, EVIL, 2, key_id("n"), ("n", 30, 3), 1000 * np.ones(1)))
        assert stale.status == Status.ERROR and stale.args[0] == "StaleCall"
        assert peer.runner is not None and peer.runner.owner.applied == {}
        reply = reply_to(peer, Call(2, EVIL, 2, key_id("n"), ("n", 1, 7), np.ones(1)))
        assert reply.status == Status.OK and reply.value is not None
        assert reply.value.to_value().tolist() == [1.0] and peer.runner.owner.applied == {"n": 1}

    def test_a_batch_push_folds_each_new_step_once_in_order(self) -> None:
        """A pipelined peer's batch (args: key, first step, run, token, later steps; the updates
        stacked): each step is folded once, in order, and a batch sent again (its answer
        was late) is answered without folding anything twice."""
        peer = lone_owner()
        folded: list[float] = []
        assert peer.runner is not None
        pull = peer.runner.spec.pull

        def recording(store, updates):
            folded.append(float(updates["n"][0]))
            pull(store, updates)
        peer.runner.owner.spec = dataclasses.replace(peer.runner.spec, pull=recording)
        batch = np.array([[1.0], [10.0], [100.0]])
        reply = reply_to(peer, Call(1, EVIL, 2, key_id("n"), ("n", 3, 0, -1, 4, 6), batch))
        assert reply.status == Status.OK and reply.args == (3,)
        assert folded == [1.0, 10.0, 100.0] and reply.value.to_value().tolist() == [111.0]
        # steps 4 and 6 again with a new one, 7: only 7 is folded
        again = np.array([[10.0], [100.0], [1000.0]])
        reply = reply_to(peer, Call(2, EVIL, 2, key_id("n"), ("n", 4, 0, -1, 6, 7), again))
        assert reply.status == Status.OK and folded == [1.0, 10.0, 100.0, 1000.0]
        assert reply.value.to_value().tolist() == [1111.0]

    def test_a_malformed_batch_push_gets_an_error_reply_and_folds_nothing(self) -> None:
        peer = lone_owner()
        stacked = np.ones((2, 1))
        for args, update in ((("n", 3, 0, -1, 2), stacked),           # steps not increasing
                             (("n", 3, 0, -1, 3), stacked),           # a step twice
                             (("n", -1, 0, -1, 4), stacked),          # a negative step
                             (("n", 3, 0, -1, 4, 5), stacked),        # 3 steps, 2 updates
                             (("n", 3, 0, -1, 4), np.ones(1)),        # not stacked
                             (("n", 3, 0, -1, 4.5), stacked),         # a float step
                             (("n", 3, 0, -1, "4"), stacked),         # a str step
                             (("n", 3, 0, -1, 4), np.ones((2, 3)))):  # of another shape
            reply = reply_to(peer, Call(1, EVIL, 2, key_id("n"), args, update))
            assert reply.status == Status.ERROR, args
        assert peer.runner is not None and peer.runner.owner.applied == {}

    def test_malformed_engine_calls_get_an_error_reply(self) -> None:
        peer = lone_owner()
        for call in (Call(1, EVIL, 2, key_id("n"), ("m", 0), np.ones(1)),   # key != name
                     Call(2, EVIL, 2, key_id("n"), (), np.ones(1)),           # no name
                     Call(3, EVIL, 2, key_id("n"), ("n", 0)),                 # no update
                     Call(4, EVIL, 99, key_id("n"), ("n",))):                 # unknown method
            assert reply_to(peer, call).status == Status.ERROR
        # an update pull cannot add makes it raise: the caller gets ERROR, the owner goes on
        bad = reply_to(peer, Call(5, EVIL, 2, key_id("n"), ("n", 0), b"xx"))
        assert bad.status == Status.ERROR and "did not contain a loop" in bad.args[1]
        assert reply_to(peer, Call(6, EVIL, 1, key_id("n"), ("n",))).status == Status.OK

    @settings(max_examples=200, deadline=None)
    @given(method=st.integers(0, 1 << 16), args=st.lists(st.one_of(
        st.none(), st.integers(-(1 << 63), (1 << 63) - 1), st.floats(allow_nan=False,
                                                                   allow_infinity=False),
        st.text(max_size=8), st.binary(max_size=8), st.sampled_from(["n", "w"])), max_size=4),
        value=st.one_of(st.none(), st.binary(max_size=16),
                        st.integers(0, 5).map(lambda n: np.arange(n, dtype=np.float32))))
    def test_arbitrary_calls_never_break_the_peer(self, method: int, args: list,
                                                  value: object) -> None:
        peer = lone_owner()
        call = Call(1, EVIL, method, key_id("n"), tuple(args), value)
        assert decode(encode(call), [bytes(f) for f in value_frames(call)]) == call
        reply = reply_to(peer, call)
        assert reply.status in {s.value for s in Status}

    def test_garbage_is_a_protocol_error_for_the_shell(self) -> None:
        peer = lone_owner()
        for wire in (b"junk", (PROTOCOL_VERSION, 10, 0, bytes(20), -1, 2, bytes(20), ["n"],
                                 [1, "|O", [1]])):
            try:
                peer.receive("evil", wire, now=1.0, frames=[b"12345678"])
            except ProtocolError:
                continue
            raise AssertionError(f"{wire!r} was accepted")


class TestPusherFence:
    def test_an_ok_from_an_owner_farther_than_a_known_peer_is_taken_as_not_owner(self) -> None:
        """A holder keeps the answer to its push as its copy (a round may skip its STORE):
        it judges that answer as its fence would the STORE."""
        kid = key_id("n")
        near, far = Contact(KadId(kid ^ 1), "near"), Contact(KadId(kid ^ (1 << 100)), "far")
        for owner, expected in ((far, Status.NOT_OWNER), (near, Status.OK)):
            peer = lone_owner()
            runner = peer.runner
            assert runner is not None
            for contact in (near, far):
                peer.node.routing.observe(contact, now=1.0)
            runner.owners["n"] = owner
            got: list[Status] = []
            eff = Effects()
            runner._ask("n", Method.PUSH, np.ones(1), 1.0, eff,
                        lambda status, clock, value, when, e: got.append(status))
            call = next(s.message for s in eff.sends if isinstance(s.message, Call))
            answer = Reply(call.rpc_id, owner.node_id, Status.OK, (5,), Blob.of(np.ones(1)), 2)
            peer.receive(owner.address, answer, now=1.1)
            assert got == [expected]
            assert ("n" in runner.owners) == (expected == Status.OK)  # else looked up again

    def test_the_owner_check_follows_the_routing_table(self) -> None:
        """An owner's closest known contact to a key is kept per routing-table version:
        a closer peer joining, and its eviction, change who owns the key at once."""
        peer = lone_owner()
        runner, node = peer.runner, peer.node
        assert runner is not None
        kid = key_id("n")
        far, near = Contact(KadId(kid ^ (1 << 150)), "far"), Contact(KadId(kid ^ 1), "near")
        mine = node.node_id ^ kid < far.node_id ^ kid    # we own it unless "near" is there
        node.routing.observe(far, now=1.0)
        assert runner.owner.closest_known(kid) == far and runner.owner._is_owner(kid) == mine
        node.routing.observe(near, now=1.0)
        assert runner.owner.closest_known(kid) == near and not runner.owner._is_owner(kid)
        node.routing.remove(near.node_id)
        assert runner.owner.closest_known(kid) == far and runner.owner._is_owner(kid) == mine
        other = key_id("not a model key")
        assert runner.owner.closest_known(other) == node.routing.closest(other, 1)[0]

    def test_a_suspect_closest_to_the_key_is_asked_not_served_here(self) -> None:
        """A lookup skips suspects (contacts that missed a reply) but the owner check counts
        them: a suspect owns its keys until evicted. A peer whose every contact was a suspect
        (a loaded machine) looked the owner up with nobody to ask, served the key itself,
        answered itself NOT_OWNER and looked up again at once, forever on its one thread."""
        peer = lone_owner()
        runner, node = peer.runner, peer.node
        assert runner is not None
        suspect = Contact(KadId(key_id("n") ^ 1), "suspect")
        node.routing.observe(suspect, now=1.0)
        _, eff = node.find_node(KadId(3), now=1.0)
        [ask] = [s.message for s in eff.sends]
        node.on_timer(TimerKind.RPC_TIMEOUT, ask.rpc_id, now=1.5)   # one miss: a suspect
        got: list[Status] = []
        eff = Effects()
        runner._ask("n", Method.GET, None, 2.0, eff,
                    lambda status, clock, value, when, e: got.append(status))
        eff = peer.route(eff, now=2.0)
        calls = [s for s in eff.sends if isinstance(s.message, Call)]
        assert got == [] and [s.address for s in calls] == ["suspect"]
        assert runner.owners["n"] == suspect


class TestRouting:
    def test_runner_dones_stay_inside_and_shell_dones_come_out(self) -> None:
        peer = lone_owner()
        runner = peer.runner
        assert runner is not None
        eff = peer.route(runner.start(now=2.0), now=2.0)
        assert eff.done == []                       # its own lookups finished inside
        assert runner.step >= 1                     # alone: it owns "n" and steps on its own
        op_id, shell_eff = peer.node.find_node(KadId(3), now=2.0)
        out = peer.route(shell_eff, now=2.0)
        assert [d.op_id for d in out.done] == [op_id]


def test_a_watcher_is_told_our_step_before_our_next_step_computes() -> None:
    """A peer that asked for our step while ahead of us (a barrier waiting on us) gets a STEP
    when our step is done. The next step, if our barrier lets it begin there, waits for a
    timer due at once: begun in the same call, its compute ran before the shell sent the
    STEP, and the two peers of a BSP job took turns computing (traced on the real wire)."""
    def step_done(watched: bool) -> tuple[list[int], Effects]:
        computed: list[int] = []
        job = counting_job()
        job.register_push(lambda ctx, values: computed.append(ctx.step) or {"n": np.ones(1)})
        node = KademliaNode(KadId(1), "me", job.config, rng=random.Random(0))
        runner = PeerRunner(job.spec(), node, 0)
        runner.values["n"] = (np.zeros(1), 0)       # held: a step begun computes at once
        runner.phase = Phase.WORKING
        if watched:
            node.watchers[EVIL] = Contact(EVIL, "evil")
        eff = Effects()
        runner._step_done(1.0, eff)
        return computed, eff

    computed, eff = step_done(watched=False)
    assert computed == [1] and not any(isinstance(s.message, Step) for s in eff.sends)
    computed, eff = step_done(watched=True)
    [told] = [s for s in eff.sends if isinstance(s.message, Step)]
    assert told.address == "evil" and told.message.step == 1
    assert computed == []                           # not yet: from the timer, after the STEP
    assert [(t.kind, t.delay_s) for t in eff.timers] == [(Timer.BEGIN, 0.0)]


def test_a_round_due_after_the_key_moved_on_leaves_the_new_owners_copy_alone() -> None:
    """Two survivors of a SIGKILLed peer evicted each other for a moment (a loaded machine):
    we took the key over, our rounds found nobody and were set to go again, then the closer
    owner W came back and stored its copy on us (taken: the key is W's again). The round
    due next ran anyway: it put our name on W's copy, sent it as our write, and W's own
    round, refused by that copy, and ours, refused by W, dropped it: W's own updates its
    round had made durable on us were lost (a real 3-peer job: a key at 598 for 600). A
    round is for a key we serve, or a write of ours: another writer's copy is left alone."""
    peer = lone_owner()
    assert peer.runner is not None
    owner, kid = peer.runner.owner, key_id("n")
    eff = Effects()
    owner._replicate_later(kid, eff)                # our round, due later
    (timer,) = eff.timers
    w = KadId(kid ^ 1)                              # closer to the key than us
    store = Store(2, w, kid, Blob.of(np.full(1, 6.0)), 60.0, clock=6, writer=w, base=0)
    peer.receive("w", store, now=1.0)
    assert peer.node.storage.get(kid, 1.0).writer == w and kid not in owner.owned
    due = owner.on_timer(timer.token, 1.1)
    assert not due.sends and not due.timers                 # no round (before: a lookup)
    assert peer.node.storage.get(kid, 1.1).version == (6, w)


def test_a_refused_round_keeps_a_closer_owners_copy_stored_on_us_meanwhile() -> None:
    """Our round (a write of ours since the take-over) was in flight when the closer owner W
    STOREd a newer copy on us (taken: our branch loses to it); then a holder refused our
    round. The refusal dropped whatever we held and put back the copy we had taken over:
    W's copy, which W's round counted as durable on us, was gone, older writes in its place.
    Only our own branch is dropped now."""
    peer = lone_owner()
    assert peer.runner is not None
    owner, node, kid = peer.runner.owner, peer.node, key_id("n")
    owner._adopted[kid] = node.storage.get(kid, 0.0)            # taken over at (0, none)
    node.storage.put(kid, Blob.of(np.ones(1)), 0.5, 3600.0, is_origin=True, clock=1,
                     writer=node.node_id)                       # our write since
    answers: list = []
    owner._waiting[kid] = [(1, EVIL, lambda answer, now, e: answers.append(answer[0]))]
    rounds: list = []
    owner._start_op = lambda op, then, eff: rounds.append(then)
    owner._replicate(kid, 0.5, Effects())                       # our round, in flight
    w = KadId(kid ^ 1)                                          # closer to the key than us
    peer.receive("w", Store(2, w, kid, Blob.of(np.full(1, 6.0)), 60.0, clock=6, writer=w,
                            base=1), now=1.0)
    assert node.storage.get(kid, 1.0).version == (6, w)
    (replicated,) = rounds
    holder = Contact(KadId(kid ^ 2), "h")
    replicated(Done(0, OpKind.STORE, kid, refusals=((holder, 6, w),), asked=1), 1.1, Effects())
    assert answers == [Status.NOT_OWNER]
    assert node.storage.get(kid, 1.1).version == (6, w)         # before: (0, 0)
