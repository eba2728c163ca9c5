"""The wire: header codec, fuzzed parsing (only ProtocolError ever escapes), and a live Node
that drops malformed messages with one WARNING each and keeps serving."""
from __future__ import annotations

import logging
import random
import re
import shutil
import struct
import weakref

import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from actorpy.errors import ActorpyError, ProtocolError, SerializationError
from actorpy.log import Throttle
from actorpy.runtime.node import Node
from actorpy.wire import header as hdr
from actorpy.wire import message as wm
from actorpy.wire.auth import Security, private_dir
from actorpy.wire.kinds import CORE_SERVICE, PROTOCOL_VERSION, Kind
from tests.conftest import wait_until

SENDER = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E),
                 min_size=1, max_size=hdr.SENDER_BYTES)


@st.composite
def headers(draw):
    service = draw(st.integers(0, 2**16 - 1))
    kind = (draw(st.sampled_from(list(Kind))) if service == CORE_SERVICE
            else draw(st.integers(0, 2**16 - 1)))
    return hdr.Header(service=service, kind=kind, sender=draw(SENDER),
                      request_id=draw(st.integers(0, 2**64 - 1)),
                      step=draw(st.integers(-2**63, 2**63 - 1)),
                      nframes=draw(st.integers(0, 2**32 - 1)),
                      flags=draw(st.sampled_from([0, hdr.FLAG_BUFFERS])),
                      from_service=draw(st.integers(0, 2**16 - 1)))


class TestHeader:
    def test_layout_is_46_bytes_in_network_order(self):
        h = hdr.Header(service=3, kind=258, sender="w-1", request_id=7, step=-2, nframes=5,
                       flags=hdr.FLAG_BUFFERS, from_service=65535)
        raw = h.encode()
        assert hdr.HEADER_BYTES == 46 and len(raw) == 46
        assert raw[:2] == b"AP" and raw[2] == PROTOCOL_VERSION and raw[3] == hdr.FLAG_BUFFERS
        assert struct.unpack("!HHHQq", raw[4:26]) == (3, 65535, 258, 7, -2)
        assert raw[26:42] == b"w-1" + b"\0" * 13
        assert struct.unpack("!I", raw[42:]) == (5,)

    @pytest.mark.parametrize("from_service", [-1, 2**16])
    def test_from_service_out_of_range_is_refused_on_encode(self, from_service):
        with pytest.raises(ProtocolError, match="out of range"):
            hdr.Header(service=1, kind=1, sender="w-1", from_service=from_service).encode()

    def test_from_service_travels_with_every_body_shape(self):
        for payload in (wm.NO_PAYLOAD, 42, b"x" * (wm.INLINE_MAX_BYTES + 1), np.arange(4.0)):
            frames = wm.assemble(5, 3, "w-1", payload, from_service=40000)
            msg = wm.Message.parse([bytes(memoryview(f).cast("B")) for f in frames], 1 << 20)
            assert (msg.from_service, msg.header.service, msg.kind) == (40000, 5, 3)

    @settings(max_examples=300, deadline=None)
    @given(headers())
    def test_roundtrip(self, h):
        got = hdr.decode(h.encode())
        assert got == h
        assert hdr.decode(memoryview(h.encode())) == h

    def test_sender_longer_than_16_bytes_is_refused_on_encode(self):
        with pytest.raises(ProtocolError, match="longer than 16"):
            hdr.Header(service=0, kind=Kind.TASK, sender="x" * 17).encode()

    @pytest.mark.parametrize("edit, reason", [
        (lambda b: b[:-1], "45 bytes"),
        (lambda b: b + b"\0", "47 bytes"),
        (lambda b: b"XY" + b[2:], "bad magic"),
        (lambda b: b[:2] + bytes([PROTOCOL_VERSION + 1]) + b[3:], "protocol version"),
        (lambda b: b[:3] + b"\x80" + b[4:], "unknown flags"),
        (lambda b: b[:8] + struct.pack("!H", 999) + b[10:], "unknown core message kind"),
        (lambda b: b[:26] + b"\0" * 16 + b[42:], "empty or not printable"),
        (lambda b: b[:26] + b"a b" + b"\0" * 13 + b[42:], "empty or not printable"),
        (lambda b: b[:26] + b"a\0b" + b"\0" * 13 + b[42:], "empty or not printable"),
        (lambda b: b[:26] + b"\xff" * 16 + b[42:], "empty or not printable"),
    ], ids=["short", "long", "magic", "version", "flags", "core-kind", "empty-sender",
            "space-in-sender", "nul-in-sender", "non-ascii-sender"])
    def test_decode_rejects(self, edit, reason):
        good = hdr.Header(service=0, kind=Kind.TASK, sender="w-1").encode()
        with pytest.raises(ProtocolError, match=reason):
            hdr.decode(edit(good))

    def test_engine_kinds_are_not_checked_against_the_core_enum(self):
        h = hdr.Header(service=9, kind=999, sender="p-1")
        assert hdr.decode(h.encode()).kind == 999


class TestFuzz:
    @settings(max_examples=500, deadline=None)
    @given(st.binary(max_size=100))
    def test_header_decode_random_bytes(self, data):
        try:
            hdr.decode(data)
        except ProtocolError:
            pass

    @settings(max_examples=500, deadline=None)
    @given(st.binary(min_size=hdr.HEADER_BYTES - 3, max_size=hdr.HEADER_BYTES - 3))
    def test_header_decode_random_body_behind_valid_magic(self, rest):
        # Past the magic and version check, every field is exercised.
        try:
            h = hdr.decode(b"AP" + bytes([PROTOCOL_VERSION]) + rest)
        except ProtocolError:
            return
        assert hdr.decode(h.encode()) == h

    @settings(max_examples=300, deadline=None)
    @given(headers(), st.integers(0, hdr.HEADER_BYTES - 1), st.integers(0, 255))
    def test_header_decode_one_flipped_byte(self, h, where, value):
        # Any single corrupted byte either still decodes to a consistent header or is refused.
        raw = bytearray(h.encode())
        raw[where] = value
        try:
            got = hdr.decode(bytes(raw))
        except ProtocolError:
            return
        assert hdr.decode(got.encode()) == got
        assert got.from_service < 2**16 and got.service < 2**16

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.binary(max_size=64), max_size=6), st.integers(0, 128))
    def test_parse_random_frames(self, frames, limit):
        try:
            msg = wm.Message.parse(frames, limit)
        except ProtocolError:
            return
        assert len(msg.frames) == msg.header.nframes

    @settings(max_examples=300, deadline=None)
    @given(headers(), st.lists(st.binary(max_size=64), max_size=5), st.integers(0, 128))
    def test_parse_valid_header_random_frames(self, h, body, limit):
        try:
            msg = wm.Message.parse([h.encode(), *body], limit)
        except ProtocolError:
            return
        assert msg.header == h and msg.frames == body
        assert all(len(f) <= limit for f in body)

    @settings(max_examples=200, deadline=None)
    @given(st.binary(max_size=48), st.lists(st.binary(max_size=16), max_size=4))
    def test_parse_zmq_frames(self, head, body):
        frames = [zmq.Frame(head), *(zmq.Frame(b) for b in body)]
        try:
            wm.Message.parse(frames, 1 << 20)
        except ProtocolError:
            pass


class TestAssemble:
    def test_no_payload_is_a_single_frame(self):
        frames = wm.assemble(CORE_SERVICE, Kind.HEARTBEAT, "w-1", step=4)
        assert len(frames) == 1
        msg = wm.Message.parse(frames, 1 << 20)
        assert msg.header.step == 4 and not msg.has_payload and msg.payload() is None

    def test_payload_roundtrip_through_parse(self):
        value = {"a": np.arange(5000.0), "b": [1, 2]}   # 40 KB: out of band
        frames = wm.assemble(7, 3, "w-1", value, request_id=99)
        msg = wm.Message.parse([bytearray(memoryview(f).cast("B")) for f in frames], 1 << 20)
        assert (msg.sender, msg.kind, msg.header.service, msg.header.request_id) == (
            "w-1", 3, 7, 99)
        assert msg.header.flags & hdr.FLAG_BUFFERS and msg.header.nframes == 3
        got = msg.payload()
        assert np.array_equal(got["a"], value["a"]) and got["b"] == [1, 2]

    def test_a_released_payload_lets_go_of_each_split_piece_once_copied(self):
        # a buffer split over frames is joined with one copy; released, the message drops
        # each piece as it is copied (before, a service's message held every piece of a
        # 200 MB push while its handler ran: one model more on a parameter server's shard)
        class Piece(bytearray):   # (a bytearray that can be watched)
            pass
        value = np.arange(100_000.0)   # 800 KB: 7 pieces of 128 KB
        frames = wm.assemble(7, 3, "w-1", value, request_id=1, chunk_bytes=128 << 10)
        pieces = [Piece(memoryview(f).cast("B")) for f in frames]
        watched = [weakref.ref(p) for p in pieces[3:]]   # the buffer's (header, layout, body)
        assert len(watched) == 7
        msg = wm.Message.parse(pieces, 1 << 20)
        del pieces
        got = msg.payload(release=True)
        assert np.array_equal(got, value) and got.flags.writeable
        assert [ref() for ref in watched] == [None] * 7 and not msg.has_payload
        with pytest.raises(ActorpyError, match="kind 3 from w-1 was read with release=True"):
            msg.payload()

    def test_small_body_travels_inside_the_header_frame(self):
        frames = wm.assemble(7, 3, "w-1", ("small", 42), request_id=5)
        assert len(frames) == 1 and len(frames[0]) > hdr.HEADER_BYTES
        msg = wm.Message.parse([zmq.Frame(frames[0])], 1 << 20)
        assert msg.header.flags == hdr.FLAG_INLINE and msg.header.nframes == 0
        assert msg.payload() == ("small", 42)
        big = wm.assemble(7, 3, "w-1", b"x" * (wm.INLINE_MAX_BYTES + 1))
        assert len(big) == 2 and not big[0][4] & hdr.FLAG_INLINE

    @pytest.mark.parametrize("tamper, reason", [
        (lambda f: [f[0], b"extra"], "inline body but 1 more frames"),
        (lambda f: [f[0][:3] + bytes([hdr.FLAG_INLINE | hdr.FLAG_BUFFERS]) + f[0][4:]],
         "inline body flag with buffers"),
        (lambda f: [f[0][:hdr.HEADER_BYTES]], "no body"),
    ])
    def test_inconsistent_inline_messages_are_refused(self, tamper, reason):
        frames = tamper(wm.assemble(7, 3, "w-1", 42))
        with pytest.raises(ProtocolError, match=reason):
            wm.Message.parse(frames, 1 << 20)

    def test_encoded_payload_is_reused(self):
        enc = wm.Encoded.of(np.arange(10_000, dtype=np.int32))
        assert enc.nbytes > 40_000
        one = wm.assemble(1, 1, "a", enc)
        two = wm.assemble(1, 2, "b", enc)
        assert one[1:] == two[1:] == list(enc.frames)
        assert np.array_equal(enc.decode(), np.arange(10_000, dtype=np.int32))

    def test_oversize_frame_is_refused_by_parse(self):
        frames = wm.assemble(1, 1, "a", b"x" * 1000)
        with pytest.raises(ProtocolError, match="over the 100-byte limit"):
            wm.Message.parse(frames, 100)


# --------------------------------------------------------------------------- live node
SERVICE, ECHO = 5, 1
MAX_FRAME = 64 << 10


@pytest.fixture(scope="module")
def live():
    """A server Node over ipc (echo handler doubling its payload), a client Node, and a raw
    DEALER with routing id 'rogue' for sending garbage."""
    where = private_dir()
    security = Security.ipc()
    server = Node("srv", f"ipc://{where}/srv", security, max_frame_bytes=MAX_FRAME).start()
    client = Node("cli", f"ipc://{where}/cli", security).start()
    server.on(SERVICE, ECHO, lambda msg: server.reply(msg, msg.payload() * 2))
    client.add_peer("srv", server.address, "worker")
    server.add_peer("cli", client.address, "driver")
    ctx = zmq.Context()
    rogue = ctx.socket(zmq.DEALER)
    rogue.linger = 0
    rogue.setsockopt(zmq.IDENTITY, b"rogue")
    rogue.connect(server.address)
    assert client.call("srv", SERVICE, ECHO, 1, timeout_s=10) == 2
    yield server, client, rogue
    rogue.close(linger=0)
    ctx.term()
    client.close()
    server.close()
    shutil.rmtree(where, ignore_errors=True)  # its sockets' directory (one per run, in /tmp)


def cause_of(text: str) -> str:
    """A drop warning's words, numbers and quoted parts blanked (a random sender's bytes)."""
    return re.sub(r"\d+", "#", re.sub(r"'[^']*'|\"[^\"]*\"", "'...'", text))


def drop_warnings(caplog):
    return [r for r in caplog.records
            if r.name in ("actorpy.runtime.node", "actorpy.runtime.receive")
            and r.levelno == logging.WARNING]


def garbage(case: str) -> list[list[bytes]]:
    good = lambda **kw: wm.assemble(SERVICE, ECHO, "rogue", 21, **kw)  # noqa: E731
    if case == "random":
        rng = random.Random(2024)
        return [[rng.randbytes(rng.randrange(0, 80)) for _ in range(rng.randrange(1, 4))]
                for _ in range(25)]
    if case == "wrong-version":
        head = hdr.Header(SERVICE, ECHO, "rogue", nframes=1, version=PROTOCOL_VERSION + 1)
        return [[head.encode(), *good()[1:]]]
    if case == "unknown-core-kind":
        head = bytearray(wm.assemble(CORE_SERVICE, Kind.TASK, "rogue", 1)[0])
        head[8:10] = struct.pack("!H", 4242)  # the kind field
        return [[bytes(head), *good()[1:]]]
    if case == "truncated":
        frames = wm.assemble(SERVICE, ECHO, "rogue", np.arange(5000.0))  # head, layout, body, chunk
        return [frames[:-1], frames[:2], frames[:1]]
    if case == "too-many-frames":  # a body too big to travel inline: header + body frames
        return [[*wm.assemble(SERVICE, ECHO, "rogue", b"x" * (wm.INLINE_MAX_BYTES + 1)),
                 b"extra"]]
    if case == "oversize":
        return [[*wm.assemble(SERVICE, ECHO, "rogue", b"x" * (MAX_FRAME + 1))]]
    if case == "impostor":
        return [wm.assemble(SERVICE, ECHO, "srv", 21), wm.assemble(SERVICE, ECHO, "cli", 21)]
    if case == "no-handler":
        return [wm.assemble(SERVICE, 77, "rogue", 1), wm.assemble(CORE_SERVICE, Kind.TASK,
                                                                  "rogue", 1)]
    raise AssertionError(case)


REASONS = {
    "random": ("header is", "bad magic"),
    "wrong-version": "protocol version",
    "unknown-core-kind": "unknown core message kind 4242",
    "truncated": "payload frames, got",
    "too-many-frames": "announces 1 payload frames, got 2",
    "oversize": "limit",
    "impostor": "claims to come from",
    "no-handler": ("no handler", "no service"),
}


class TestLiveNode:
    @pytest.mark.parametrize("case", [
        "random", "wrong-version", "unknown-core-kind", "truncated", "too-many-frames",
        "oversize", "impostor", "no-handler",
    ])
    def test_garbage_is_dropped_with_a_warning_per_cause_and_node_keeps_serving(
            self, live, caplog, case):
        server, client, rogue = live
        server._receiver._throttle = Throttle()   # the cases share a sender and some causes
        caplog.set_level(logging.WARNING, logger="actorpy")
        messages = garbage(case)
        before = server.bytes_in
        for frames in messages:
            rogue.send_multipart(frames)
        sent = sum(len(f) for frames in messages for f in [b"rogue", *frames])
        wait_until(lambda: server.bytes_in >= before + sent, 10, f"the {case} messages taken")
        assert client.call("srv", SERVICE, ECHO, 21, timeout_s=10) == 42
        warnings = drop_warnings(caplog)
        # each cause once (per 10 s): before, a line per message, so a sender's flood of
        # garbage was a flood of log lines
        causes = [cause_of(r.getMessage()) for r in warnings]
        assert warnings and len(set(causes)) == len(causes), causes
        for record in warnings:
            text = record.getMessage()
            assert "'rogue'" in text, text  # names the sender (the socket identity)
            reasons = REASONS[case] if isinstance(REASONS[case], tuple) else (REASONS[case],)
            assert any(reason in text for reason in reasons), text

    def test_bad_payload_is_one_warning_not_a_traceback(self, live, caplog):
        server, client, rogue = live
        caplog.set_level(logging.WARNING, logger="actorpy")
        head = hdr.Header(SERVICE, ECHO, "rogue", nframes=1).encode()
        rogue.send_multipart([head, b"not a pickle"])
        records = wait_until(lambda: [r for r in caplog.records
                                      if "does not decode" in r.getMessage()],
                             5, "the undecodable payload to be logged")
        assert len(records) == 1 and records[0].levelno == logging.WARNING
        assert records[0].exc_info is None and "'rogue'" in records[0].getMessage()
        assert client.call("srv", SERVICE, ECHO, [1], timeout_s=10) == [1, 1]


# --------------------------------------------------------------------------- frame limits
LIMIT = 2 << 20


@pytest.fixture(scope="module")
def limited():
    """Two Nodes over ipc that both refuse frames over 2 MB; the server echoes, or answers
    with a live array it changes right after replying."""
    where = private_dir()
    security = Security.ipc()
    server = Node("lsrv", f"ipc://{where}/lsrv", security, max_frame_bytes=LIMIT).start()
    client = Node("lcli", f"ipc://{where}/lcli", security, max_frame_bytes=LIMIT).start()
    live = np.zeros(1 << 20)  # 8 MB
    server.on(SERVICE, ECHO, lambda msg: server.reply(msg, msg.payload()))

    def answer_then_change(msg):
        server.reply(msg, live)
        live[:] += 1  # the replier moves on at once, as a PS shard applying the next push

    server.on(SERVICE, 2, answer_then_change)
    client.add_peer("lsrv", server.address, "worker")
    server.add_peer("lcli", client.address, "driver")
    yield server, client
    client.close()
    server.close()
    shutil.rmtree(where, ignore_errors=True)


class TestFrameLimits:
    def test_a_3mb_pickled_body_is_split_and_arrives(self, limited):
        server, client = limited
        blob = random.Random(3).randbytes(3 << 20)
        frames = wm.assemble(SERVICE, ECHO, "lcli", blob, max_frame_bytes=LIMIT)
        assert len(frames) == 4 and max(memoryview(f).nbytes for f in frames) <= LIMIT
        assert client.call("lsrv", SERVICE, ECHO, blob, timeout_s=30) == blob
        rows = [(f"key{i}", i) for i in range(250_000)]  # ~3.5 MB of pickle
        assert client.call("lsrv", SERVICE, ECHO, rows, timeout_s=30) == rows

    def test_a_frame_that_cannot_fit_fails_on_the_sender(self, limited):
        server, client = limited
        big = wm.Encoded.of(np.arange(1 << 20, dtype=np.float64), chunk_bytes=8 << 20)
        with pytest.raises(SerializationError, match="max_frame_bytes"):
            client.request("lsrv", SERVICE, ECHO, big)
        with pytest.raises(SerializationError, match="max_frame_bytes is 40"):
            wm.assemble(SERVICE, ECHO, "lcli", 1, max_frame_bytes=40)  # below the header
        assert client.call("lsrv", SERVICE, ECHO, 5, timeout_s=10) == 5  # nothing broke

    def test_a_reply_of_a_live_array_never_goes_out_half_updated(self, limited):
        server, client = limited
        seen = [client.call("lsrv", SERVICE, 2, timeout_s=30) for _ in range(6)]
        assert [float(a[0]) for a in seen] == [float(i) for i in range(6)]
        assert all(float(a.min()) == float(a.max()) for a in seen), "a torn reply"
