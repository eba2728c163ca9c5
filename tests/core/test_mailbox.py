"""A service's inbox (high-water marks, control items, close) and the u16 service ids."""
from __future__ import annotations

import threading

import pytest

from actorpy.errors import ActorpyError
from actorpy.runtime.mailbox import MAX_SERVICE_ID, Mailbox, Offer, ServiceIds


class TestMailbox:
    def test_items_mark_refuses_messages_but_not_control_items(self):
        box = Mailbox(max_items=3, max_bytes=1 << 20)
        assert [box.offer(f"m{i}", 10) for i in range(4)] == [Offer.ACCEPTED] * 3 + [Offer.FULL]
        assert box.post("timer") is True  # control items are never refused while open
        assert [box.get(0) for _ in range(4)] == ["m0", "m1", "m2", "timer"]
        assert box.get(0) is None
        assert box.offer("m3", 10) is Offer.ACCEPTED  # room again
        assert (box.refused, box.peak_messages) == (1, 3)

    def test_bytes_mark_lets_one_big_message_into_an_empty_box(self):
        box = Mailbox(max_items=100, max_bytes=1000)
        assert box.offer("big", 5000) is Offer.ACCEPTED  # alone: never refused forever
        assert box.offer("small", 1) is Offer.FULL
        assert box.get(0) == "big"
        assert box.offer("a", 600) is Offer.ACCEPTED
        assert box.offer("b", 400) is Offer.ACCEPTED
        assert box.offer("c", 1) is Offer.FULL

    def test_refuse_then_close(self):
        box = Mailbox(max_items=10, max_bytes=1000)
        box.offer("m", 1)
        box.refuse_messages()
        assert box.offer("late", 1) is Offer.CLOSED
        assert box.post("reply") is True
        assert box.close() == ["m", "reply"]
        assert box.post("after") is False and box.offer("x", 1) is Offer.CLOSED

    def test_get_waits_for_an_item(self):
        box = Mailbox(max_items=10, max_bytes=1000)
        got: list[object] = []
        t = threading.Thread(target=lambda: got.append(box.get(10)))
        t.start()
        box.post("wake")
        t.join(10)
        assert got == ["wake"]

    def test_claim_only_when_empty_and_the_service_idle(self):
        box = Mailbox(max_items=10, max_bytes=1000)
        assert box.claim()               # empty, nobody serving: the caller may run it
        assert not box.claim()           # one claim at a time
        box.release()
        box.post("tick")
        assert not box.claim()           # an item is queued: it goes first
        assert box.get(0) == "tick"
        assert not box.claim()           # the service's thread is handling "tick"
        assert box.get(0) is None        # ... and done with it
        assert box.claim()
        box.release()
        box.refuse_messages()
        assert not box.claim()           # a stopping service runs nothing more

    def test_get_waits_for_a_claim_to_end(self):
        box = Mailbox(max_items=10, max_bytes=1000)
        assert box.claim()
        box.post("after")                # queued while another thread handles a message
        got: list[object] = []
        t = threading.Thread(target=lambda: got.append(box.get(10)))
        t.start()
        t.join(0.2)
        assert got == [] and t.is_alive()  # not before the claim ends: one at a time
        box.release()
        t.join(10)
        assert got == ["after"]


    def test_a_service_stepped_aside_may_be_claimed_and_steps_back_after_the_release(self):
        box = Mailbox(max_items=10, max_bytes=1000)
        assert not box.step_aside()      # not handling an item: nothing to step aside from
        box.post("compute")
        assert box.get(0) == "compute"
        assert not box.claim()           # handling it
        assert box.step_aside()
        assert not box.step_aside()      # once
        assert box.claim()               # as if idle: another thread runs a message
        back = threading.Thread(target=box.step_back)
        back.start()
        back.join(0.2)
        assert back.is_alive()           # not before the claim ends: one at a time
        box.release()
        back.join(10)
        assert not back.is_alive()
        assert not box.claim()           # handling "compute" again

    def test_aside_only_claims_a_box_stepped_aside_never_an_idle_one(self):
        box = Mailbox(max_items=10, max_bytes=1000)
        assert not box.claim(aside_only=True)    # idle: the service's own thread runs it
        box.post("compute")
        assert box.get(0) == "compute"
        assert not box.claim(aside_only=True)    # handling it
        assert box.step_aside()
        assert box.claim(aside_only=True)
        box.release()
        box.step_back()
        assert box.get(0) is None                # idle again
        assert not box.claim(aside_only=True) and box.claim()

    def test_a_service_stepped_aside_is_not_claimed_past_queued_items(self):
        box = Mailbox(max_items=10, max_bytes=1000)
        box.post("compute")
        assert box.get(0) == "compute"
        assert box.step_aside()
        box.offer("m1", 1)
        assert not box.claim()           # m1 came first: the next message queues behind it
        assert box.claim_queued(lambda item: item == "other") is None   # not the caller's
        assert box.claim_queued(lambda item: True) == ["m1"]  # the caller runs m1 first
        assert len(box) == 0 and box.claim_queued(lambda item: True) is None
        box.release()
        box.offer("m2", 1)
        box.post("timer", timer=True)    # a timer due: it waits for the service's thread
        box.offer("m3", 1)
        assert box.claim_queued(lambda item: True) == ["m2", "m3"]
        box.release()
        box.offer("m4", 1)
        box.post("reply")                # a control item: only the service's thread runs it
        box.offer("m5", 1)
        assert box.claim_queued(lambda item: True) is None
        box.step_back()
        assert [box.get(0) for _ in range(4)] == ["timer", "m4", "reply", "m5"]

    def test_a_box_stepped_aside_is_lent_only_after_after_s(self):
        box = Mailbox(max_items=10, max_bytes=1000)
        assert box.lent_in() is None     # not stepped aside
        box.post("compute")
        assert box.get(0) == "compute"
        assert box.step_aside(after_s=60)
        assert 59 < box.lent_in() <= 60
        assert not box.claim()           # too soon: a short work keeps its messages
        box.offer("m1", 1)
        assert box.claim_queued(lambda item: True) is None
        box.step_back()
        assert box.lent_in() is None
        assert box.get(0) == "m1"
        assert box.step_aside(after_s=0)
        assert box.lent_in() is None     # lent already
        assert box.claim()
        box.release()

    def test_an_idle_service_is_never_claimed_past_queued_items(self):
        box = Mailbox(max_items=10, max_bytes=1000)
        box.offer("m1", 1)
        assert box.claim_queued(lambda item: True) is None   # its thread takes m1 next
        assert box.get(0) == "m1"


class TestServiceIds:
    def test_all_65535_then_a_clear_error_then_oldest_freed_first(self):
        ids = ServiceIds()
        got = [ids.allocate() for _ in range(MAX_SERVICE_ID)]
        assert got == list(range(1, 2**16))
        with pytest.raises(ActorpyError, match="already runs 65535 services"):
            ids.allocate()
        ids.release(700, "service 'a' (id 700) was stopped")
        ids.release(9, "service 'b' (id 9) died: SystemExit")
        ids.release(9, "released twice: ignored")
        assert ids.reason(9) == "service 'b' (id 9) died: SystemExit"
        assert ids.allocate() == 700 and ids.reason(700) is None
        assert ids.reason(9) is not None  # remembered until reused
        assert ids.allocate() == 9
        with pytest.raises(ActorpyError):
            ids.allocate()
        assert ids.in_use() == MAX_SERVICE_ID

    def test_fresh_ids_before_reuse(self):
        ids = ServiceIds(max_id=4)
        a = ids.allocate()
        ids.release(a, "gone")
        assert [ids.allocate() for _ in range(3)] == [2, 3, 4]
        assert ids.allocate() == a

    @pytest.mark.parametrize("bad", [0, 2**16])
    def test_max_id_within_the_header_field(self, bad):
        with pytest.raises(ValueError):
            ServiceIds(max_id=bad)
