"""The log throttle: per-key, bounded however many fresh keys an outsider presents."""
from __future__ import annotations

import logging
import tracemalloc
import types

import pytest

from actorpy import log as alog
from actorpy.log import Throttle
from actorpy.wire import auth

FLOOD = 100_000


class TestThrottle:
    def test_repeats_are_held_back_and_counted(self):
        t = Throttle(10.0)
        assert [t.allow("k", now=x) for x in (0.0, 1.0, 2.0, 10.5)] == \
            [(True, 0), (False, 0), (False, 0), (True, 2)]
        assert t.allow("other-key", now=10.6) == (True, 0)

    def test_a_flood_of_fresh_keys_stays_bounded_and_is_still_reported(self):
        t = Throttle(10.0, max_keys=100)
        first = [t.allow(f"key-{i}".encode(), now=0.0) for i in range(FLOOD)]
        # the first 100 keys are reported one by one, then the "other" bucket once
        assert sum(ok for ok, _ in first) == 101 and len(t) == 100
        # an interval later the table has room again (the oldest keys have expired) ...
        later = [t.allow(f"late-{i}".encode(), now=10.0) for i in range(100)]
        assert later == [(True, 0)] * 100 and len(t) == 100
        # ... and once it is full again, the bucket reports everything it held back
        assert t.allow(b"one-more", now=10.0) == (True, FLOOD - 101)
        assert len(t) == 100

    def test_a_known_key_keeps_its_own_count_while_the_table_is_full(self):
        t = Throttle(10.0, max_keys=2)
        assert t.allow("a", now=0.0) == (True, 0)
        assert t.allow("b", now=0.0) == (True, 0)
        assert t.allow("a", now=1.0) == (False, 0)
        for i in range(50):
            t.allow(f"fresh-{i}", now=2.0)
        assert t.allow("a", now=10.0) == (True, 1)

    def test_what_an_evicted_key_held_back_is_reported_by_the_bucket(self):
        t = Throttle(10.0, max_keys=1)
        t.allow("a", now=0.0)
        assert t.allow("a", now=1.0) == (False, 0)     # one held back for "a"
        assert t.allow("b", now=11.0) == (True, 0)     # "a" expired: evicted for "b"
        assert t.allow("c", now=12.0) == (True, 1)     # full: "c" reports "a"'s one

    def test_max_keys_must_be_positive(self):
        with pytest.raises(ValueError):
            Throttle(max_keys=0)


class TestAllowListUnderAFlood:
    def test_fresh_client_keys_neither_grow_memory_nor_flood_the_log(self, caplog,
                                                                     monkeypatch):
        allow = auth._AllowList(frozenset({b"A" * 40}))
        # the flood within one interval of the throttle: under tracemalloc on a loaded
        # machine it took longer than the 10 s, and each interval over let 1024 more through
        monkeypatch.setattr(alog, "time", types.SimpleNamespace(monotonic=lambda: 0.0))
        caplog.set_level(logging.WARNING, logger=auth.__name__)
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot()
            refused = sum(not allow.callback(auth.ZAP_DOMAIN, b"%040d" % i) for i in range(FLOOD))
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        # what the throttle allocates, and the keys it keeps (made here); not the log records
        mine = [tracemalloc.Filter(True, alog.__file__), tracemalloc.Filter(True, __file__)]
        grown = sum(s.size_diff for s in after.filter_traces(mine).compare_to(
            before.filter_traces(mine), "filename"))
        assert refused == FLOOD and allow.callback(auth.ZAP_DOMAIN, b"A" * 40)
        assert len(allow._throttle) <= allow._throttle.max_keys
        # unbounded, 100 000 keys of 40 bytes with their entries would take ~20 MB
        assert grown < 1 << 20, f"the throttle grew by {grown} bytes"
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1   # throttled per cause, not per key

    def test_fresh_client_keys_are_one_warning_per_interval_with_a_count(self, caplog,
                                                                        monkeypatch):
        # before, throttled per client key (the outsider's choice): a fresh key per
        # connection was a WARNING per connection (1 960 lines in 20 s from one script)
        now = [0.0]
        monkeypatch.setattr(alog, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
        caplog.set_level(logging.WARNING, logger=auth.__name__)
        allow = auth._AllowList(frozenset({b"A" * 40}))
        for i in range(500):
            now[0] = i * 0.01               # 100 fresh keys a second, 5 s
            assert not allow.callback(auth.ZAP_DOMAIN, b"%040d" % i)
        now[0] = 10.5                       # the next interval: one line, with the count
        assert not allow.callback(auth.ZAP_DOMAIN, b"%040d" % 500)
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(said) == 2, said[:5]
        assert "not a member of this cluster" in said[0] and "0" * 40 in said[0]
        assert "499 more rejected connections" in said[1], said[1]
