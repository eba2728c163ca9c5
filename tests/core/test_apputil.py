"""The flags every app shares, and how the CLI finds an app's subcommand."""
from __future__ import annotations

import argparse
import io
import json
import runpy

import pytest
from hypothesis import given, strategies as st

from actorpy import apputil
from actorpy.cli import _command_index, _hoist_log_level
from actorpy.errors import ConfigError


def _parse(argv):
    parser = argparse.ArgumentParser()
    apputil.add_cluster_arguments(parser, default_workers=3)
    return parser.parse_args(argv)


def test_flags_and_defaults():
    args = _parse(["--manager", "tcp://h:7400", "--secret-file", "s", "--json"])
    assert ((args.manager, args.secret_file, args.json, args.workers)
            == ("tcp://h:7400", "s", True, None))
    assert _parse([]).default_workers == 3


@pytest.mark.parametrize("argv, message", [(["--workers", "0"], "at least 1"),
                                           (["--secret-file", "x"], "goes with --manager")])
def test_bad_flags_fail_before_connecting(argv, message):
    with pytest.raises(ConfigError, match=message):
        apputil.connect_from_args(_parse(argv))


@pytest.mark.parametrize("flag", ["--manager", "--secret-file"])
def test_an_empty_address_or_file_is_refused(flag, capsys):
    # before: `--manager "$UNSET"` ran the job on an embedded cluster, on this machine,
    # without a word
    with pytest.raises(SystemExit) as info:
        _parse([flag, " "])
    assert info.value.code == 2
    assert f"argument {flag}: needs " in capsys.readouterr().err


def test_print_json_is_one_document():
    out = io.StringIO()
    apputil.print_json({"wörd": 2}, out)
    assert json.loads(out.getvalue()) == {"wörd": 2} and out.getvalue().count("\n") == 1


@given(st.dictionaries(st.text(), st.integers() | st.text() | st.floats(allow_nan=False,
                                                                         allow_infinity=False)))
def test_print_json_writes_text_as_it_is(value):
    """Non-ASCII characters are written as they are, never as \\u escapes (an ASCII
    encoding is tried first and kept only when it escaped nothing), and the text parses
    back to the value."""
    out = io.StringIO()
    apputil.print_json(value, out)
    assert out.getvalue() == json.dumps(value, ensure_ascii=False) + "\n"
    assert json.loads(out.getvalue()) == value


@pytest.mark.parametrize("encoding", ["ascii", "cp1252"])
def test_print_json_escapes_what_the_stream_cannot_encode(encoding):
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding=encoding)
    apputil.print_json({"wörd": 2, "😀": float("nan")}, out)
    text = raw.getvalue().decode(encoding)
    assert json.loads(text) == {"wörd": 2, "😀": None} and text.count("\n") == 1


def test_print_json_writes_non_finite_floats_as_null():
    out = io.StringIO()
    apputil.print_json({"loss": float("nan"), "runs": [{"e": float("-inf")}, (1.5, 2)]}, out)
    assert "NaN" not in out.getvalue() and "Infinity" not in out.getvalue()
    assert json.loads(out.getvalue()) == {"loss": None, "runs": [{"e": None}, [1.5, 2]]}


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "0", "-1", "one"])
def test_positive_float_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        apputil.positive_float(text)
    assert apputil.positive_float("0.25") == 0.25


@pytest.mark.parametrize("argv, index", [(["sim", "--json"], 0),
                                         (["--log-level", "INFO", "sim"], 2),
                                         (["--log-level", "INFO"], None), ([], None)])
def test_command_word_skips_global_options(argv, index):
    assert _command_index(argv) == index


def test_remote_errors_are_one_line_unless_debugging(caplog):
    import logging

    from actorpy.errors import RemoteError
    exc = RemoteError("ValueError", "bad input", "Traceback ...\n  File x\n", "w-1")
    with caplog.at_level(logging.WARNING, logger=""):
        line = apputil.error_line(exc)
    assert "\n" not in line and "bad input" in line and "--log-level DEBUG" in line
    with caplog.at_level(logging.DEBUG, logger=""):
        assert "Traceback" in apputil.error_line(exc)
    assert apputil.error_line(ConfigError("x")) == "x"


def test_a_remote_actorpy_error_is_shown_without_its_class_path():
    # before: "actorpy p2p-sgd: actorpy.errors.ActorpyError: peer p-1/1 is running job ..."
    from actorpy.errors import RemoteError
    exc = RemoteError("actorpy.errors.ActorpyError", "peer p-1/1 is busy", "Traceback", "p-1")
    assert apputil.error_line(exc) == ("peer p-1/1 is busy (on node p-1; --log-level DEBUG "
                                       "shows the remote traceback)")


def test_running_out_of_memory_is_one_line(capsys):
    # `actorpy sgd --features 1000000000`: numpy's MemoryError was a traceback dump
    from actorpy.cli import _run

    def allocate() -> int:
        raise MemoryError("Unable to allocate 7.28 TiB for an array")
    assert _run("sgd", allocate) == 1
    err = capsys.readouterr().err
    assert err == "actorpy sgd: out of memory: Unable to allocate 7.28 TiB for an array\n"


def test_ctrl_c_while_the_command_line_loads_exits_130_without_a_traceback(monkeypatch):
    """`actorpy` imports its command line inside a handler: a Ctrl-C in those ~0.15 s of
    imports printed a KeyboardInterrupt traceback (and died by SIGINT), unlike one later."""
    import sys

    from actorpy import entry

    class Interrupting:
        def find_spec(self, name, path=None, target=None):
            if name == "actorpy.cli":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "actorpy.cli", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Interrupting(), *sys.meta_path])
    assert entry.main(["--help"]) == 130
    # `python -m actorpy` too: it imported the command line with no handler
    monkeypatch.setattr(sys, "argv", ["actorpy", "--help"])
    with pytest.raises(SystemExit) as info:
        runpy.run_module("actorpy", run_name="__main__")
    assert info.value.code == 130


@pytest.mark.parametrize("argv, hoisted", [
    (["sgd", "--steps", "3", "--log-level", "DEBUG"],
     ["--log-level", "DEBUG", "sgd", "--steps", "3"]),
    (["wordcount", "a", "--log-level=info", "b"], ["--log-level=info", "wordcount", "a", "b"]),
    (["--log-level", "INFO", "sim", "--json"], ["--log-level", "INFO", "sim", "--json"]),
    (["sim", "--", "--log-level", "X"], ["sim", "--", "--log-level", "X"]),
    (["secret", "--log-level"], ["secret", "--log-level"]),
])
def test_a_log_level_after_the_subcommand_moves_before_it(argv, hoisted):
    # the hint "--log-level DEBUG shows the remote traceback" is typed after the app's
    # flags; it used to be "unrecognized arguments"
    assert _hoist_log_level(argv, _command_index(argv)) == hoisted
