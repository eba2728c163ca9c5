"""Serialization: round-trips of arrays, tensors, containers and functions; array data out of
band; chunking; decoded arrays writable; clear errors for what cannot be pickled or decoded."""
from __future__ import annotations

import pickle
import struct
import threading

import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from actorpy.errors import ProtocolError, SerializationError
from actorpy.wire import serde

try:  # torch is an optional extra: only the tests that use it need it
    import torch
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


def local_roundtrip(obj, chunk_bytes=serde.DEFAULT_CHUNK_BYTES):
    """encode -> frames copied into fresh writable buffers (as a receiver holds them) -> decode."""
    frames, has_buffers = serde.encode(obj, chunk_bytes)
    received = [bytearray(memoryview(f).cast("B")) for f in frames]
    return serde.decode(received, has_buffers)


@pytest.fixture(scope="module")
def pipe():
    """A real PUSH -> PULL pair over tcp 127.0.0.1: frames received with copy=False, as the
    node receives them."""
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.linger = 0
    pull.bind("tcp://127.0.0.1:*")
    push = ctx.socket(zmq.PUSH)
    push.linger = 0
    push.connect(pull.getsockopt_string(zmq.LAST_ENDPOINT))

    def roundtrip(obj, chunk_bytes=serde.DEFAULT_CHUNK_BYTES):
        frames, has_buffers = serde.encode(obj, chunk_bytes)
        push.send_multipart(frames, copy=False)
        assert pull.poll(5000), "frames did not arrive within 5 s"
        return serde.decode(pull.recv_multipart(copy=False), has_buffers)

    yield roundtrip
    push.close(linger=0)
    pull.close(linger=0)
    ctx.term()


def assert_same_array(got, want):
    assert type(got) is type(want)
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    if want.dtype.hasobject:
        assert got.tolist() == want.tolist()
    else:
        assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


def assert_same_tensor(got, want):
    assert type(got) is type(want)
    assert got.dtype == want.dtype
    assert tuple(got.shape) == tuple(want.shape)
    assert got.requires_grad == want.requires_grad
    assert torch.equal(got.detach(), want.detach())


_RNG = np.random.default_rng(1234)
DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool",
          "complex64"]
SHAPES = [(), (0,), (7,), (3, 4), (2, 3, 5), (0, 4)]


def _array(dtype, shape):
    n = int(np.prod(shape))
    if dtype == "bool":
        return (_RNG.integers(0, 2, n) == 1).reshape(shape)
    if dtype == "complex64":
        return (_RNG.normal(size=n) + 1j * _RNG.normal(size=n)).astype(dtype).reshape(shape)
    return (_RNG.normal(size=n) * 100).astype(dtype).reshape(shape)


class TestNumpy:
    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("shape", SHAPES, ids=str)
    def test_roundtrip_dtypes_and_shapes(self, dtype, shape):
        a = _array(dtype, shape)
        assert_same_array(local_roundtrip(a), a)

    @pytest.mark.parametrize("make", [
        lambda: np.arange(40_000.0)[::3],
        lambda: np.arange(24_000, dtype=np.int32).reshape(4000, 6)[:, 1:4],
        lambda: np.arange(24_000, dtype=np.float32).reshape(4000, 6)[:, ::2].T,
        lambda: np.arange(10_000.0)[::-1],
        lambda: np.arange(60_000, dtype=np.int16).reshape(3, 400, 50).transpose(2, 0, 1)[::2],
    ], ids=["step", "column-slice", "transpose", "negative-stride", "3d-permuted"])
    def test_non_contiguous_travels_out_of_band(self, make):
        a = make()
        assert a.nbytes > serde.IN_BAND_MAX_BYTES
        assert not (a.flags.c_contiguous or a.flags.f_contiguous)
        frames, has_buffers = serde.encode(a)
        assert has_buffers and len(frames) == 3
        assert memoryview(frames[2]).nbytes == a.nbytes
        assert_same_array(local_roundtrip(a), a)

    @pytest.mark.parametrize("make", [
        lambda: np.arange(40.0)[::3],
        lambda: np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2].T,
        lambda: np.arange(serde.IN_BAND_MAX_BYTES // 4, dtype=np.float32),
        lambda: np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    ], ids=["step", "transpose", "at-the-limit", "fortran"])
    def test_small_arrays_travel_in_band(self, make):
        a = make()
        frames, has_buffers = serde.encode(a)
        assert not has_buffers and len(frames) == 1
        got = local_roundtrip(a)
        assert_same_array(got, a)
        assert got.flags.writeable

    @pytest.mark.parametrize("dtype", [*DTYPES, ">f4", ">i8", "<u2"])
    @pytest.mark.parametrize("shape", [*SHAPES, (5000,)], ids=str)
    @pytest.mark.parametrize("read_only", [False, True], ids=["writable", "read-only"])
    def test_arrays_in_containers_roundtrip_as_they_were(self, dtype, shape, read_only, pipe):
        # In a container, the C pickler reduces a simple array itself (dtype as its string):
        # values, dtype (byte order too), shape and the read-only flag come back, in band
        # (small) and out of band (5000 x 8 bytes).
        a = _array(dtype.lstrip("<>"), shape).astype(dtype)
        a.flags.writeable = not read_only
        value = {"a": a, "step": (3, [a, a.reshape(-1)])}
        for got in (local_roundtrip(value), pipe(value)):
            assert_same_array(got["a"], a)
            assert got["a"].dtype.str == a.dtype.str
            assert_same_array(got["step"][1][1], a.reshape(-1))
            if a.size:
                assert got["a"].flags.writeable == (not read_only)
        assert b"cloudpickle" not in bytes(serde.encode(value)[0][0])

    def test_a_step_tuple_is_one_frame_from_the_c_pickler(self):
        # (step, {key: update}, batch, seconds): builtin containers and arrays only.
        value = (3, {"w": np.arange(1000, dtype=np.float32), "b": np.float32(2.5)}, 256, 0.5)
        frames, has_buffers = serde.encode(value)
        assert not has_buffers and len(frames) == 1
        assert b"cloudpickle" not in bytes(frames[0])
        got = local_roundtrip(value)
        assert got[0] == 3 and got[2:] == (256, 0.5) and got[1]["b"] == np.float32(2.5)
        assert_same_array(got[1]["w"], value[1]["w"])

    def test_a_container_holding_a_function_falls_back_to_cloudpickle(self):
        offset = 2.0
        value = (np.ones(3), {"f": lambda x: x + offset})
        got = local_roundtrip(value)
        assert_same_array(got[0], value[0]) and got[1]["f"](1.0) == 3.0

    def test_fortran_order_is_kept(self):
        a = np.asfortranarray(np.arange(12.0).reshape(3, 4))
        got = local_roundtrip(a)
        assert got.flags.f_contiguous and not got.flags.c_contiguous
        assert_same_array(got, a)

    def test_structured_dtype(self):
        dt = np.dtype([("id", "<i4"), ("pos", "<f8", (2,)), ("tag", "S3")])
        a = np.array([(1, (0.5, 1.5), b"abc"), (2, (2.5, 3.5), b"xy")], dtype=dt)
        got = local_roundtrip(a)
        assert got.dtype == dt and got.shape == a.shape
        assert got.tobytes() == a.tobytes()
        assert got["tag"].tolist() == [b"abc", b"xy"] and got["pos"][1, 1] == 3.5

    def test_object_dtype_goes_in_band(self):
        a = np.array([1, "two", None, (3, 4)], dtype=object)
        frames, has_buffers = serde.encode(a)
        assert not has_buffers and len(frames) == 1
        assert_same_array(local_roundtrip(a), a)

    @settings(max_examples=60, deadline=None)
    @given(hnp.arrays(dtype=st.sampled_from([np.dtype(d) for d in DTYPES]),
                      shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)))
    def test_roundtrip_property(self, a):
        assert_same_array(local_roundtrip(a), a)


@needs_torch
class TestTorch:
    @pytest.mark.parametrize("make", [
        lambda: torch.randn(3, 4),
        lambda: torch.randn(5, 2).to(torch.bfloat16),
        lambda: torch.arange(-5, 5, dtype=torch.int64),
        lambda: torch.tensor([True, False, True]),
        lambda: torch.randn(4, 6).t(),
        lambda: torch.randn(8)[::2],
        lambda: torch.randn(3, 3, requires_grad=True),
        lambda: torch.nn.Parameter(torch.randn(2, 5)),
        lambda: torch.nn.Parameter(torch.randn(2), requires_grad=False),
        lambda: torch.tensor(2.5),
        lambda: torch.zeros(0, 3),
        lambda: torch.zeros(0, dtype=torch.bfloat16),
    ], ids=["float32", "bfloat16", "int64", "bool", "transposed", "strided", "requires-grad",
            "parameter", "frozen-parameter", "0-d", "empty", "empty-bfloat16"])
    def test_roundtrip(self, make):
        t = make()
        assert_same_tensor(local_roundtrip(t), t)

    def test_requires_grad_result_is_a_leaf_that_trains(self):
        got = local_roundtrip(torch.ones(3, requires_grad=True))
        (got * 2).sum().backward()
        assert got.is_leaf and torch.equal(got.grad, torch.full((3,), 2.0))

    def test_tensor_data_is_out_of_band_and_not_copied_on_send(self):
        t = torch.randn(256, 1024)  # 1 MB
        frames, has_buffers = serde.encode(t)
        assert has_buffers and len(frames) == 3
        assert len(frames[0]) < 1024
        chunk = np.frombuffer(frames[2], dtype=np.uint8)
        assert chunk.nbytes == t.numel() * 4
        assert chunk.ctypes.data == t.data_ptr()

    def test_conjugate_view(self):
        # torch.conj() is lazy (a conjugate bit); the value that travels must be the conjugate.
        z = torch.randn(3, 2, dtype=torch.complex64)
        assert_same_tensor(local_roundtrip(z.conj()), z.conj().resolve_conj())


class TestContainersAndFunctions:
    @needs_torch
    def test_nested_containers_mix_arrays_tensors_and_objects(self):
        value = {
            "weights": [np.arange(6.0).reshape(2, 3), torch.ones(4, dtype=torch.float64)],
            "meta": ("step", 7, {"lr": 0.1, "tags": {"a", "b"}}),
            "grad": torch.randn(2, 2, requires_grad=True),
            "empty": np.zeros((0,), np.int8),
            "none": None,
        }
        frames, has_buffers = serde.encode(value)
        assert not has_buffers and len(frames) == 1  # every array is small: all in band
        got = local_roundtrip(value)
        assert_same_array(got["weights"][0], value["weights"][0])
        assert_same_tensor(got["weights"][1], value["weights"][1])
        assert_same_tensor(got["grad"], value["grad"])
        assert_same_array(got["empty"], value["empty"])
        assert got["meta"] == value["meta"] and got["none"] is None

    def test_lambda_and_closure(self):
        offset = np.arange(3.0)

        def make_scaler(k):
            return lambda x: x * k + offset

        f = local_roundtrip(make_scaler(3.0))
        assert np.array_equal(f(np.ones(3)), np.ones(3) * 3.0 + offset)
        g = local_roundtrip(lambda s: s.upper() + "!")
        assert g("hi") == "HI!"

    def test_empty_payloads(self):
        for value in (None, b"", "", [], {}, ()):
            frames, has_buffers = serde.encode(value)
            assert not has_buffers and len(frames) == 1
            assert local_roundtrip(value) == value


class TestOutOfBand:
    def test_array_data_is_beyond_the_body(self):
        a = np.arange(1 << 18, dtype=np.float32)  # 1 MB
        frames, has_buffers = serde.encode(a)
        assert has_buffers and len(frames) == 3
        assert len(frames[1]) < 1024, "array bytes leaked into the pickle body"
        assert struct.unpack("!2I", frames[0]) == (1, 1)
        chunk = np.frombuffer(frames[2], dtype=np.uint8)
        assert chunk.nbytes == a.nbytes and chunk.ctypes.data == a.ctypes.data  # no copy

    @pytest.mark.parametrize("extra", [0, 100], ids=["even", "ragged"])
    def test_large_buffer_splits_into_chunks_and_reassembles(self, extra, pipe):
        chunk = 256 << 10
        a = np.frombuffer(bytearray(np.random.default_rng(5).bytes((1 << 20) + extra)),
                          dtype=np.uint8)
        frames, _ = serde.encode(a, chunk_bytes=chunk)
        expected_chunks = -(-a.nbytes // chunk)
        assert struct.unpack("!2I", frames[0]) == (1, expected_chunks)
        assert len(frames) == 2 + expected_chunks
        assert [memoryview(f).nbytes for f in frames[2:]] == (
            [chunk] * (a.nbytes // chunk) + ([extra] if extra else []))
        got = pipe(a, chunk_bytes=chunk)
        assert_same_array(got, a)
        assert got.flags.writeable

    @needs_torch
    def test_several_buffers_some_chunked(self):
        value = [np.arange(100, dtype=np.int64), np.arange(50_000, dtype=np.float64),
                 torch.arange(3)]
        frames, _ = serde.encode(value, chunk_bytes=64 << 10)
        counts = struct.unpack("!2I", frames[0])
        assert counts == (1, 7)  # body (the small two inside), then 400 KB in 64 KB pieces
        got = local_roundtrip(value, chunk_bytes=64 << 10)
        assert_same_array(got[0], value[0])
        assert_same_array(got[1], value[1])
        assert_same_tensor(got[2], value[2])

    def test_read_only_arrays_arrive_read_only(self, pipe):
        # pickle protocol 5 keeps a buffer's read-only flag (READONLY_BUFFER opcode).
        a = np.arange(300_000, dtype=np.float32)
        a.flags.writeable = False
        got = pipe(a)
        assert_same_array(got, a)
        assert not got.flags.writeable

    @needs_torch
    def test_received_arrays_and_tensors_are_writable(self, pipe):
        value = {"big": np.arange(300_000, dtype=np.float32), "small": np.arange(3.0),
                 "t": torch.arange(10.0), "bigt": torch.zeros(100_000)}
        got = pipe(value)
        for key in ("big", "small"):
            assert got[key].flags.writeable
            got[key][0] = -1.0
            assert got[key][0] == -1.0
        got["t"][0] = 5.0
        got["bigt"] += 1
        assert got["t"][0] == 5.0 and float(got["bigt"].sum()) == 100_000.0


class TestErrors:
    def test_unpicklable_object_names_its_type(self):
        with pytest.raises(SerializationError, match="_thread.lock") as info:
            serde.encode({"ok": 1, "lock": threading.Lock()})
        assert isinstance(info.value, TypeError)
        with pytest.raises(SerializationError, match="generator"):
            serde.encode((i for i in range(3)))

    def test_a_reason_ending_in_a_full_stop_gets_no_second_one(self):
        class Refuses:
            def __reduce__(self):
                raise ValueError("a key is required.")
        with pytest.raises(SerializationError) as info:
            serde.dumps(Refuses())
        assert "a key is required. The piece that fails" in str(info.value)   # was ".."

    def test_serialization_error_names_the_top_level_value(self):
        class Holder:
            def __init__(self):
                self.lock = threading.RLock()

        with pytest.raises(SerializationError, match=r"Holder.*RLock|RLock.*Holder"):
            serde.dumps(Holder())

    def _good(self):
        n = serde.IN_BAND_MAX_BYTES // 8 + 1   # both out of band
        return serde.encode([np.arange(float(n)), np.arange(n)])

    @pytest.mark.parametrize("mutate, has_buffers, reason", [
        (lambda f: [], True, "no body"),
        (lambda f: [], False, "no body"),
        (lambda f: f[:1], True, "layout frame but no body"),
        (lambda f: [b"\0\0\0\x01\0", *f[1:]], True, "partial entry"),
        (lambda f: [b"", *f[1:]], True, "empty"),
        (lambda f: [struct.pack("!3I", 1, 0, 1), *f[1:]], True, "does not match"),
        (lambda f: [struct.pack("!3I", 1, 1, 2), *f[1:]], True, "does not match"),
        (lambda f: [struct.pack("!2I", 1, 1), *f[1:]], True, "does not match"),
        (lambda f: f[:-1], True, "does not match"),
        (lambda f: [*f, b"extra"], True, "does not match"),
        (lambda f: f, False, "no buffer layout"),
    ], ids=["empty-with-buffers", "empty", "no-body", "partial-entry", "empty-layout", "zero-count",
            "count-too-big", "too-few-counts", "frame-missing", "frame-extra", "flag-clear"])
    def test_bad_layout_raises_protocol_error(self, mutate, has_buffers, reason):
        frames, flag = self._good()
        assert flag
        with pytest.raises(ProtocolError, match=reason):
            serde.decode(mutate(list(frames)), has_buffers)

    @needs_torch
    @pytest.mark.parametrize("name", ["not_a_dtype", "Tensor", "nn"])
    def test_unknown_torch_dtype_is_a_protocol_error(self, name):
        with pytest.raises(ProtocolError, match="unknown torch dtype"):
            serde._rebuild_tensor(np.zeros(4, np.uint8), name, (1,), False, False)


class TestSplitBody:
    def test_a_big_pickled_body_is_split_into_views_of_one_pickle(self, pipe):
        rows = [(f"w{i}", i) for i in range(60_000)]
        frames, has_layout = serde.encode(rows, chunk_bytes=64 << 10)
        counts = struct.unpack(f"!{len(frames[0]) // 4}I", frames[0])
        assert has_layout and len(counts) == 1 and counts[0] == len(frames) - 1 > 3
        # No copy on send: every piece is a view of the same pickled bytes.
        assert len({id(memoryview(f).obj) for f in frames[1:]}) == 1
        assert all(memoryview(f).nbytes <= 64 << 10 for f in frames)
        assert pipe(rows, chunk_bytes=64 << 10) == rows

    def test_a_split_body_with_arrays(self, pipe):
        value = {"rows": [(f"w{i}", i) for i in range(30_000)],
                 "a": np.arange(100_000, dtype=np.float32)}
        frames, _ = serde.encode(value, chunk_bytes=32 << 10)
        counts = struct.unpack(f"!{len(frames[0]) // 4}I", frames[0])
        assert len(counts) == 2 and counts[0] > 1 and counts[1] == -(-400_000 // (32 << 10))
        got = pipe(value, chunk_bytes=32 << 10)
        assert got["rows"] == value["rows"]
        assert_same_array(got["a"], value["a"])

    def test_a_big_body_under_the_chunk_size_is_one_view(self):
        blob = bytes(range(256)) * 1024  # 256 KB
        frames, has_layout = serde.encode(blob)
        assert not has_layout and len(frames) == 1 and isinstance(frames[0], memoryview)
        assert local_roundtrip(blob) == blob

    def test_joined_lists_unpickle_as_one_list(self):
        parts = [serde.encode(list(range(i * 100, (i + 1) * 100)), 256) for i in range(4)]
        joined = serde.JoinedLists(parts)
        frames, has_layout = serde.encode(joined, 512)
        assert serde.decode([bytes(memoryview(f)) for f in frames], has_layout) == list(range(400))

    @pytest.mark.parametrize("protocol", [0, 2, 5])
    @pytest.mark.parametrize("piece", [1, 7, 4096])
    def test_any_pickle_split_anywhere_reads_back(self, protocol, piece):
        # Protocol 0 reads by lines (readline), 2 by small reads, 5 by 64 KB frames.
        value = {"text": "line\nbreak" * 50, "n": list(range(300)), "f": 1.5, "b": b"\n\x00"}
        body = pickle.dumps(value, protocol=protocol)
        pieces = [body[i:i + piece] for i in range(0, len(body), piece)]
        frames = [struct.pack("!I", len(pieces)), *pieces]
        assert serde.decode(frames, True) == value
