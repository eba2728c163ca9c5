"""Model values as the engines keep them: numpy arrays and torch tensors, each key's type,
shape and dtype fixed by its first value. Shared by the parameter-server and P2P engines'
checks of updates; torch is never imported here (a tensor's class says where it comes
from).
"""
from __future__ import annotations

import numbers
from typing import Any, Mapping

import numpy as np

from actorpy.barrier.policy import Decision
from actorpy.errors import ConfigError

_BYTES = (bytes, bytearray, memoryview)
#: numpy dtype kinds a model may hold: bool, signed and unsigned integers, floats, complex
_NUMERIC = frozenset("biufc")


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer, a numpy one too (a sweep over ``np.arange``), and not
    a bool (``True`` is an int to Python, never a count or a size to a caller).

    >>> is_int(3), is_int(np.int64(3)), is_int(True), is_int(3.0)
    (True, True, False, False)
    """
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def family(value: Any) -> str | None:
    """"numpy" or "torch" for an array or a tensor, else None."""
    if isinstance(value, np.ndarray):
        return "numpy"
    module = type(value).__module__ or ""
    if module.startswith("torch") and hasattr(value, "shape") and hasattr(value, "dtype"):
        return "torch"
    return None


def describe(value: Any) -> str:
    """``"a float32 array of shape (4,)"``-style text for error messages.

    >>> describe([1.0]), describe(b"x"), describe(3), describe(None)
    ('a list', 'bytes', 'an int', 'None')
    """
    fam = family(value)
    if value is None:
        return "None"
    if fam is None:
        if isinstance(value, _BYTES):
            return "bytes"
        name = type(value).__name__
        return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"
    dtype = str(value.dtype).replace("torch.", "")
    kind = "array" if fam == "numpy" else "tensor"
    return f"a {dtype} {kind} of shape {tuple(value.shape)}"


def yes_or_no(value: Any, what: str) -> bool:
    """``value`` as the answer a yes/no callback (``what``: "stop", say) must give: a bool,
    numpy's included, an int, or a one-value (0-d) array or tensor. Anything else is a
    ``TypeError`` naming the callback: a string such as "no" is true, and an array of
    several values has no truth at all.

    >>> yes_or_no(np.float32(0.01) < 0.05, "stop")
    True
    >>> yes_or_no("no", "stop")
    Traceback (most recent call last):
    TypeError: stop returned a str; it must return True (stop) or False (go on)
    """
    if isinstance(value, (bool, np.bool_, int, np.integer)) or (
            family(value) is not None and tuple(value.shape) == ()):
        return bool(value)
    raise TypeError(f"{what} returned {describe(value)}; it must return True (stop) or False "
                    "(go on)")


def as_decision(answer: Any) -> Decision:
    """A custom barrier's answer (a policy's ``decide``, or a function given to
    ``register_barrier``) as a :class:`Decision`: a Decision as it is, a bool (as
    :func:`yes_or_no` takes it) as a Decision to advance or wait. Anything else is a
    ``TypeError``: a string such as "no" would have let the worker go.

    >>> as_decision(True), as_decision(Decision(False, ("w1",))).waiting_on
    (Decision(advance=True, waiting_on=()), ('w1',))
    >>> as_decision("no")
    Traceback (most recent call last):
    TypeError: barrier returned a str; it must return a Decision, True (advance) or False (wait)
    """
    if isinstance(answer, Decision):
        return answer
    try:
        return Decision(yes_or_no(answer, "barrier"))
    except TypeError:
        raise TypeError(f"barrier returned {describe(answer)}; it must return a Decision, True "
                        "(advance) or False (wait)") from None


def fits(value: Any, like: Any) -> bool:
    """True if ``value`` is an array or tensor of the family, shape and dtype of ``like``;
    numpy dtypes that differ in byte order alone count as the same (``as_like`` makes
    ``value`` the model's): arithmetic on a big-endian model (``np.zeros(3, ">f8")``) gives
    native-order results, and ``w + u`` was refused as a change of dtype.

    >>> fits(np.zeros(3) + 1, np.zeros(3, ">f8")), fits(np.zeros(3, "<f4"), np.zeros(3, ">f8"))
    (True, False)
    """
    if type(value) is np.ndarray and type(like) is np.ndarray:   # the common case, at once
        return value.shape == like.shape and (value.dtype == like.dtype
                                              or _same_but_byte_order(value.dtype, like.dtype))
    fam = family(value)
    return (fam is not None and fam == family(like) and tuple(value.shape) == tuple(like.shape)
            and (value.dtype == like.dtype or fam == "numpy"
                 and _same_but_byte_order(value.dtype, like.dtype)))


def _same_but_byte_order(a: np.dtype, b: np.dtype) -> bool:
    return a.newbyteorder("<") == b.newbyteorder("<")


def as_like(value: Any, like: Any) -> Any:
    """``value`` (which ``fits`` ``like``) in ``like``'s numpy dtype: a copy in the model's
    byte order where only that differs, else ``value`` itself.

    >>> as_like(np.zeros(2) + 1, np.zeros(2, ">f8")).dtype.str
    '>f8'
    """
    if isinstance(value, np.ndarray) and isinstance(like, np.ndarray) \
            and value.dtype != like.dtype:
        return value.astype(like.dtype)
    return value


def check_model(init: Mapping[str, Any], *, bytes_ok: bool = False) -> None:
    """Refuse, before a job starts, a model the engines cannot keep: a key that is not a
    str, a value that is not a numpy array or torch tensor (or bytes, with ``bytes_ok``),
    an array of Python objects (``np.array([1, "a"], dtype=object)``, a ragged list made
    an array) or of another dtype that is not numeric (structured, datetime, str, bytes),
    or a sparse or quantized torch tensor. An object array travels only pickled (never on
    the zero-copy path, and not at all on the P2P overlay), a checkpoint cannot hold it, and
    it failed later, deep in a worker, as an update that did not fit the model; the others
    failed there in numpy's or torch's words.

    Raises:
        ConfigError: naming the key and what its value is, or ``init`` is no mapping.

    >>> check_model({"w": np.array([1, "a"], dtype=object)})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    actorpy.errors.ConfigError: init['w'] is an array of dtype object (Python objects): ...
    """
    if not isinstance(init, Mapping):   # an array was "ambiguous truth value", a list a
        # TypeError from dict(): both far from saying what init should be
        raise ConfigError(f"init is {describe(init)}: it must be a dict of key -> value "
                          "(numpy arrays or torch tensors), e.g. {'w': np.zeros(16)}")
    for key, value in init.items():
        fam = family(value)
        if not isinstance(key, str) or (fam is None and not (bytes_ok
                                                             and isinstance(value, _BYTES))):
            raise ConfigError(f"init[{key!r}] is {describe(value)}: keys are strings and values "
                              "numpy arrays or torch tensors" + (" or bytes" if bytes_ok else ""))
        if not key.isascii():
            try:   # keys are hashed and sent as UTF-8: a lone surrogate (a file name
                key.encode("utf-8")   # decoded with surrogateescape) failed deep in both
            except UnicodeEncodeError as exc:   # engines, as a UnicodeEncodeError
                raise ConfigError(f"init key {key!r} is not valid Unicode text ({exc.reason} "
                                  f"at index {exc.start}): keys must encode as UTF-8") from None
        if fam == "numpy" and value.dtype.hasobject:
            raise ConfigError(f"init[{key!r}] is an array of dtype {value.dtype} (Python "
                              "objects): values must be numeric arrays, e.g. np.asarray(value, "
                              "dtype=np.float64); pad a ragged list, or give each row its own "
                              "key")
        if fam == "numpy" and value.dtype.kind not in _NUMERIC:
            # a structured, datetime, str or bytes array was taken, then failed on a worker
            # or a shard in numpy's words ("ufunc 'multiply' did not contain a loop")
            raise ConfigError(f"init[{key!r}] is a numpy array of dtype {value.dtype} (numeric "
                              "dtypes only): values must be arrays of bools, integers, floats "
                              "or complex numbers; give each field of a record its own key")
        if fam == "torch" and str(getattr(value, "layout", "torch.strided")) != "torch.strided":
            # a sparse tensor failed on the shard: "nbytes is not defined for sparse tensors"
            raise ConfigError(f"init[{key!r}] is a torch tensor of layout {value.layout} (dense "
                              "tensors only): pass value.to_dense()")
        if fam == "torch" and getattr(value, "is_quantized", False):   # no arithmetic on it
            raise ConfigError(f"init[{key!r}] is a quantized torch tensor of dtype "
                              f"{value.dtype} (unquantized tensors only): pass "
                              "value.dequantize()")


#: A model at most this big may be served on its node's I/O thread while its service is idle
#: (``Service.quick_kinds``: one thread hand-off less per update): the PS engine's shard and
#: the P2P engine's owners; a bigger model's pull and reply stay on the service's thread.
QUICK_MODEL_BYTES = 1 << 20


def nbytes(values: Mapping[str, Any]) -> int:
    """A model's size in bytes (numpy arrays and torch tensors; anything else counts 0).

    >>> nbytes({"w": np.zeros(4, np.float32), "note": "x"})
    16
    """
    total = 0
    for value in values.values():
        size = getattr(value, "nbytes", None)
        if size is None and hasattr(value, "element_size"):
            size = value.element_size() * value.nelement()
        total += int(size or 0)
    return total
