"""`actorpy wordcount`: the app end to end, as a user runs it, against collections.Counter."""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from actorpy.errors import ActorpyTimeout
from apps import wordcount

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXT = ("The cat and THE hat\r\nnaïve Café e\u0301te\u0301 日本 - of\n"
        "a b\u00a0c it IS so  \t  will\nZebra zebra ZEBRA\n")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "actorpy", "wordcount", *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT})


def test_json_output_equals_counter(tmp_path):
    for i in range(3):  # the first with a byte order mark, as Windows editors write
        (tmp_path / f"t{i}.txt").write_text(TEXT * (i + 1),
                                           encoding="utf-8-sig" if i == 0 else "utf-8")
    out = _run("--workers", "2", "--json", str(tmp_path / "t0.txt"), str(tmp_path / "t[12].txt"))
    assert out.returncode == 0, out.stderr
    expected = collections.Counter(w for w in TEXT.lower().split()
                                   if w not in wordcount.STOP_WORDS)
    assert json.loads(out.stdout) == {w: n * 6 for w, n in expected.items()}
    assert "the" not in json.loads(out.stdout) and json.loads(out.stdout)["zebra"] == 18


def test_table_and_missing_input(tmp_path):
    (tmp_path / "t.txt").write_text(TEXT, encoding="utf-8")
    out = _run("--workers", "1", "--top", "2", str(tmp_path))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1].split() == ["1", "zebra", "3"] and len(lines) == 4
    missing = _run("--workers", "1", str(tmp_path / "nope*.txt"))
    assert missing.returncode == 1 and "nope*.txt" in missing.stderr
    many = _run("--workers", "1000", str(tmp_path))  # took a minute, then failed
    assert many.returncode == 2 and "at most 256 workers, not 1000" in many.stderr
    assert len(many.stderr.splitlines()) == 1
    for flag, bad in (("--timeout", "nan"), ("--timeout-s", "-5")):  # NaN never timed out
        wrong = _run(flag, bad, str(tmp_path))
        assert wrong.returncode == 2 and "must be a finite number > 0" in wrong.stderr


def test_table_on_a_stdout_that_cannot_encode_the_words(tmp_path):
    (tmp_path / "t.txt").write_text("日本 日本 naïve\n", encoding="utf-8")
    for flags in ([], ["--json"]):
        out = subprocess.run([sys.executable, "-m", "actorpy", "wordcount", "--workers", "1",
                              *flags, str(tmp_path)], capture_output=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": ROOT, "PYTHONIOENCODING": "ascii"})
        assert out.returncode == 0 and b"Traceback" not in out.stderr, out.stderr
        text = out.stdout.decode("ascii")
        if flags:
            assert json.loads(text) == {"日本": 2, "naïve": 1}
        else:
            assert "\\u65e5\\u672c" in text and "na\\xefve" in text
            # the counts line up: a word is padded as printed, escapes and all
            assert len({len(line) for line in text.splitlines()[:-1]}) == 1, text


def test_bad_cluster_flags_are_a_usage_error(tmp_path):
    (tmp_path / "t.txt").write_text("x\n", encoding="utf-8")
    for app in ("wordcount", "kmeans"):
        out = subprocess.run([sys.executable, "-m", "actorpy", app, "--secret-file", "s",
                              *([str(tmp_path)] if app == "wordcount" else [])],
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": ROOT})
        assert out.returncode == 2 and "--secret-file goes with --manager" in out.stderr, out


def test_undecodable_bytes_fail_or_are_replaced(tmp_path):
    (tmp_path / "bad.txt").write_bytes("Café bar\nfo".encode() + b"\xff" + "o cafÉ\n".encode())
    strict = _run("--workers", "1", str(tmp_path / "bad.txt"))
    assert strict.returncode == 1
    assert "bad.txt" in strict.stderr and "byte offset 12" in strict.stderr
    assert "--errors replace" in strict.stderr and "mapre.load()" not in strict.stderr
    assert len(strict.stderr.splitlines()) == 1
    replaced = _run("--workers", "1", "--errors", "replace", "--json", str(tmp_path / "bad.txt"))
    assert replaced.returncode == 0, replaced.stderr
    assert json.loads(replaced.stdout) == {"café": 2, "bar": 1, "fo\ufffdo": 1}


def test_a_manager_that_never_answers_is_not_blamed_on_timeout_s(tmp_path, capsys,
                                                                  monkeypatch):
    # before: "counting did not finish within --timeout-s 3600 s; raise --timeout-s", for a
    # join that waited 30 s for a listener that never answered (review)
    def silent(args, **settings):
        raise ActorpyTimeout("no manager answered at tcp://127.0.0.1:1 within 30.0 s")
    monkeypatch.setattr(wordcount.apputil, "connect_from_args", silent)
    (tmp_path / "t.txt").write_text("x y\n", encoding="utf-8")
    assert wordcount.main([str(tmp_path)]) == 1
    assert capsys.readouterr().err == ("actorpy wordcount: no manager answered at "
                                       "tcp://127.0.0.1:1 within 30.0 s\n")


def test_a_run_past_its_timeout_names_the_flag(tmp_path, capsys):
    # before: "reduce_by_key_locally did not finish within 1e-06 s; pass a larger timeout_s
    # (or check the workers' logs)": the engine's names, not the command's
    (tmp_path / "t.txt").write_text("x y\n" * 1000, encoding="utf-8")
    # --timeout, as in every other app (it was only --timeout-s, which still works)
    assert wordcount.main(["--workers", "1", "--timeout", "1e-6", str(tmp_path)]) == 1
    assert capsys.readouterr().err == ("actorpy wordcount: counting did not finish within "
                                       "--timeout 1e-06 s; raise --timeout\n")


def test_table_columns_line_up_for_wide_and_combining_characters():
    lines = wordcount.format_top({"日本": 3, "cafe\u0301": 2, "😀": 2, "naïve": 1}, 10)
    ends = {wordcount.columns(line) for line in lines}
    assert len(ends) == 1, lines  # every count ends in the same terminal column
    assert wordcount.columns("e\u0301日😀") == 5


def test_table_columns_line_up_for_words_printed_as_escapes():
    lines = wordcount.format_top({"日本": 3, "cafe\u0301": 2, "naïve": 1, "cat": 1}, 10,
                                 encoding="ascii")
    assert lines[1].split() == ["1", "\\u65e5\\u672c", "3"]
    assert len({len(line) for line in lines}) == 1, lines
    assert wordcount.format_top({"naïve": 1}, 1, "utf-8") == wordcount.format_top({"naïve": 1}, 1)


def test_table_escapes_control_characters():
    lines = wordcount.format_top({"\x1b]0;owned\x07": 2, "a\u200db": 1}, 10)
    assert "\\x1b]0;owned\\x07" in lines[1] and "\x1b" not in "".join(lines)
    assert "a\u200db" in lines[2]  # a zero-width joiner (emoji sequences) is not a control


def test_table_cuts_a_word_of_a_million_characters():
    # a file of NUL bytes is one word: 20 MB of them took 29 s to escape and print whole
    lines = wordcount.format_top({"\x00" * 1_000_000: 1, "cat": 2}, 5)
    assert max(map(len, lines)) < 400
    assert lines[1].split()[1] == "cat"
    assert "\\x00" * wordcount.SHOWN_CHARS + "... (1,000,000 characters)" in lines[2]


def test_partition_counter_matches_split_then_lower():
    lines = ["İstanbul ǅemal ŉ ΣΑΣ", "a\u2028b", "x\u00a0y"]
    got = dict(wordcount.count_partition(iter(lines)))
    expected = collections.Counter(w.lower() for line in lines for w in line.split()
                                   if w.lower() not in wordcount.STOP_WORDS)
    assert got == expected


def test_block_counter_matches_the_line_counter():
    lines = ["İstanbul ǅemal ŉ ΣΑΣ Cat cat CAT", "a\u2028b\x1cc", "x\u00a0y \u2003",
             "The\x85end"]
    blocks = ["\n".join(lines[:2]) + "\r\n", "\n".join(lines[2:])]  # line ends kept
    got = dict(wordcount.count_blocks(iter(blocks)))
    assert got == dict(wordcount.count_partition(iter(lines)))
    assert got["cat"] == 3 and got["b"] == 1 and got["c"] == 1
    assert dict(wordcount.count_blocks(iter([]))) == {}


# words from letters whose lower case is longer, or changes in context (İ, final Σ, ǅ, ŉ),
# ASCII and unicode whitespace, stop words in every case
_PIECES = (list("aAzZ İıΣσςǅŉß\u00a0\u2003\u2028\x1c\x85\t")
           + ["The", "OF", "é", "e\u0301", "日本"])
_WORD_TEXT = st.lists(st.sampled_from(_PIECES), max_size=12).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_WORD_TEXT, max_size=6), max_size=4))
def test_block_counter_equals_the_line_counter_on_any_text(blocks_of_lines):
    lines = [line for block in blocks_of_lines for line in block]
    blocks = ["\n".join(block) + "\n" for block in blocks_of_lines if block]
    got = dict(wordcount.count_blocks(iter(blocks)))
    assert got == dict(wordcount.count_partition(iter(lines)))


def test_demo_section_prints_the_top_words(capsys):
    wordcount.demo()
    out = capsys.readouterr().out
    assert "wordcount (map-reduce engine)" in out and "was" in out and "1" in out
