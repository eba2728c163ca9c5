"""Reading splits on line boundaries, decoding errors, inputs and outputs (no cluster)."""
from __future__ import annotations

import errno
import glob
import os
import subprocess
import sys
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engines.mapre import io
from engines.mapre.errors import (ArgumentError, InputChanged, InputDecodeError, InputNotFound,
                                  InputNotWords, OutputExists)
from engines.mapre.plan import Split

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINE = st.lists(st.sampled_from(["a", "é", "e\u0301", "\u00a0", " ", "\r", "日", "\t",
                                 "\U0001f600", "z"]), max_size=12).map("".join)


def reference_lines(data: bytes) -> list[str]:
    """What one-item-per-line means: split on \\n, strip one \\r before it, no empty tail."""
    pieces = data.decode("utf-8").split("\n")
    last = pieces.pop()  # after the final newline: a last line without one, or nothing
    return [p[:-1] if p.endswith("\r") else p for p in pieces] + ([last] if last else [])


def read_all(path: str, size: int, split_bytes: int, block_bytes: int) -> list[str]:
    splits = [Split(path, s, min(s + split_bytes, size)) for s in range(0, size, split_bytes)]
    out: list[str] = []
    for split in splits:
        for lines in io.read_split(split, "strict", block_bytes):
            out.extend(lines)
    return out


class TestReadSplit:
    @given(st.lists(LINE, max_size=30), st.sampled_from(["\n", "\r\n"]), st.booleans(),
           st.integers(1, 40), st.integers(1, 16), st.booleans())
    @settings(max_examples=120, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    def test_every_line_once_whatever_the_cuts(self, tmp_path, lines, newline, trailing,
                                               split_bytes, block_bytes, bom):
        data = newline.join(lines).encode() + (newline.encode() if trailing and lines else b"")
        path = tmp_path / "f.txt"
        path.write_bytes(io.BOM * bom + data)  # a byte order mark at the start is not text
        assert read_all(str(path), len(data) + 3 * bom, split_bytes, block_bytes) == \
            reference_lines(data)

    def test_crlf_and_unicode_are_kept_apart(self, tmp_path):
        nfc, nfd = "café", unicodedata.normalize("NFD", "café")
        data = f"{nfc}\r\n{nfd}\u00a0x\r\nlast\r".encode()
        path = tmp_path / "u.txt"
        path.write_bytes(data)
        got = read_all(str(path), len(data), 5, 3)
        assert got == [nfc, nfd + "\u00a0x", "last\r"]  # a lone \r at EOF is data

    def test_undecodable_byte_names_file_and_offset(self, tmp_path):
        path = tmp_path / "bad.txt"
        path.write_bytes(b"good line\nsecond \xff line\n")
        with pytest.raises(InputDecodeError) as info:
            read_all(str(path), 24, 100, 4)
        assert info.value.offset == 17 and info.value.path == str(path)
        assert ("bad.txt: byte offset 17" in str(info.value)
                and "errors='replace'" in str(info.value))
        lines = [x for part in io.read_split(Split(str(path), 0, 24), "replace") for x in part]
        assert lines == ["good line", "second \ufffd line"]
        path.write_bytes(io.BOM + b"good line\nsecond \xff line\n")  # offsets count the mark
        with pytest.raises(InputDecodeError, match="byte offset 20"):
            read_all(str(path), 27, 100, 4)


    @given(st.lists(LINE, max_size=30), st.booleans(), st.integers(1, 40), st.integers(1, 16),
           st.booleans())
    @settings(max_examples=60, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    def test_text_blocks_hold_every_line_once(self, tmp_path, lines, trailing, split_bytes,
                                              block_bytes, bom):
        data = "\n".join(lines).encode() + (b"\n" if trailing and lines else b"")
        path = tmp_path / "b.txt"
        path.write_bytes(io.BOM * bom + data)
        size = len(data) + 3 * bom
        blocks = [b for s in range(0, size, split_bytes)
                  for b in io.read_split_text(Split(str(path), s, min(s + split_bytes, size)),
                                              "strict", block_bytes)]
        assert "".join(blocks) == data.decode()
        assert all(b.endswith("\n") for b in blocks[:-1])

    @given(st.lists(LINE, max_size=30), st.booleans(), st.integers(1, 40), st.integers(1, 16))
    @settings(max_examples=60, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    def test_cut_long_lines_keeps_every_word_once(self, tmp_path, lines, trailing, split_bytes,
                                                  block_bytes):
        data = "\n".join(lines).encode() + (b"\n" if trailing and lines else b"")
        path = tmp_path / "c.txt"
        path.write_bytes(data)
        blocks = [b for s in range(0, len(data), split_bytes)
                  for b in io.read_split_text(Split(str(path), s, min(s + split_bytes, len(data))),
                                              "strict", block_bytes, cut_long_lines=True)]
        assert "".join(blocks) == data.decode()
        assert all(b[-1].isspace() for b in blocks[:-1])
        words = [w for b in blocks for w in b.lower().split()]
        assert words == data.decode().lower().split()

    def test_cut_long_lines_holds_a_block_not_the_line(self, tmp_path):
        # one line of words (text8 is one line of 100 MB) was read, joined and decoded whole
        words = [f"w{i % 997}" for i in range(20_000)]
        path = tmp_path / "one.txt"
        path.write_bytes(" ".join(words).encode())
        size = path.stat().st_size
        for start in (0, 1000):  # the split the line starts in reads it all, the next none
            blocks = list(io.read_split_text(Split(str(path), start, size // 2), "strict", 256,
                                             cut_long_lines=True))
            assert max(map(len, blocks), default=0) <= 256 + 4  # a block, and the rest of a word
            assert [w for b in blocks for w in b.split()] == (words if start == 0 else [])
        assert [len(b) for b in io.read_split_text(Split(str(path), 0, size), "strict",
                                                   256)] == [size]

    def test_cut_long_lines_refuses_a_word_longer_than_memory_allows(self, tmp_path,
                                                                      monkeypatch):
        # a sparse file of 2 GB (NUL bytes: valid UTF-8, no whitespace) was one word, held
        # about five times over by the worker and sent whole to the driver
        monkeypatch.setattr(io, "MAX_WORD_BYTES", 1000)
        path = tmp_path / "zeros.bin"
        path.write_bytes(b"ok fine\n" + b"\x00" * 5000 + b" tail\n")
        size = path.stat().st_size
        with pytest.raises(InputNotWords, match="zeros.bin: the 1,016 bytes from offset 8 "
                                                "hold no whitespace: not text made of words "
                                                r"\(a binary or sparse file\?\)"):
            list(io.read_split_text(Split(str(path), 0, size), "strict", 256,
                                    cut_long_lines=True))
        whole = io.read_split_text(Split(str(path), 0, size), "strict", 256)  # lines: no limit
        assert "".join(whole) == path.read_text()

    def test_cut_long_lines_cuts_at_every_whitespace_str_split_splits_on(self, tmp_path,
                                                                          monkeypatch):
        # words parted by CR alone (old Mac files), VT or U+3000 only were refused as "not
        # words": only space and tab were cut at
        assert set(io.WORD_SEPARATORS) == {c.encode() for c in map(chr, range(sys.maxunicode + 1))
                                           if len(f"a{c}b".split()) == 2}
        monkeypatch.setattr(io, "MAX_WORD_BYTES", 1000)
        for sep in ("\r", "\x0b", "\x1f", "\u3000", "\u00a0", "\x85", "\u2029"):
            text = sep.join(f"Wörd{i % 37}Σ日" for i in range(3000)) + sep
            path = tmp_path / "seps.txt"
            path.write_bytes(text.encode())
            size = path.stat().st_size
            for block_bytes in (61, 256):   # odd sizes cut blocks inside characters
                blocks = [b for s in range(0, size, 5000)  # str, so no character was split
                          for b in io.read_split_text(Split(str(path), s, min(s + 5000, size)),
                                                      "strict", block_bytes, cut_long_lines=True)]
                assert "".join(blocks) == text
                assert max(map(len, blocks)) <= 2 * block_bytes
                assert [w for b in blocks for w in b.lower().split()] == text.lower().split()

    def test_text_without_whitespace_is_not_called_binary(self, tmp_path, monkeypatch):
        monkeypatch.setattr(io, "MAX_WORD_BYTES", 1000)
        path = tmp_path / "dashes.txt"
        path.write_bytes("a b\n".encode() + "word—".encode() * 1000)
        with pytest.raises(InputNotWords) as info:
            list(io.read_split_text(Split(str(path), 0, path.stat().st_size), "strict", 256,
                                    cut_long_lines=True))
        assert "binary" not in str(info.value)
        assert "hold no whitespace: one word longer than a worker holds" in str(info.value)

    def test_a_file_cut_short_while_its_split_is_read_is_an_error(self, tmp_path):
        # before: the lines past the new end were not read, without a word (a log rotated
        # while a worker read it: the count came out short)
        path = tmp_path / "shrinks.txt"
        path.write_bytes(b"%099d\n" % 0 * 300)   # more than a file object's buffer
        blocks = io.read_blocks(Split(str(path), 0, 30_000), block_bytes=1000)
        assert next(blocks) == (0, b"%099d\n" % 0 * 10)
        os.truncate(path, 5000)
        with pytest.raises(InputChanged, match=r"shrinks.txt is 5,000 bytes now, but this job "
                                               "reads it up to byte 30,000: it was truncated"):
            list(blocks)

    def test_text_blocks_check_utf8(self, tmp_path):
        path = tmp_path / "bad.txt"
        path.write_bytes(b"good line\r\nsecond \xff line\n")
        with pytest.raises(InputDecodeError) as info:
            list(io.read_split_text(Split(str(path), 0, 25), "strict", 4))
        assert info.value.offset == 18
        assert list(io.read_split_text(Split(str(path), 0, 25), "replace")) == [
            "good line\r\nsecond \ufffd line\n"]

    def test_a_file_cut_short_after_listing_is_an_error_not_fewer_lines(self, tmp_path):
        # before: the splits past the new end read nothing, and a count over the file came
        # out short without a word (a log rotated, a file rewritten while the job ran)
        path = tmp_path / "shrinks.txt"
        path.write_bytes(b"one\ntwo\nthree\nfour\n")
        splits = io.make_splits([str(path)], 8)
        os.truncate(path, 9)
        # the file had 19 bytes when listed: 12 is where its first split ends, and was
        # named as its size then
        with pytest.raises(InputChanged, match=r"shrinks.txt is 9 bytes now, but this job "
                                               "reads it up to byte 12: it was truncated or "
                                               "rewritten since the job listed its input"):
            [list(io.read_split(s)) for s in splits]
        # grown meanwhile: the lines as listed, the new ones are not the job's
        path.write_bytes(b"one\ntwo\nthree\nfour\nfive\n")
        assert [line for s in splits for block in io.read_split(s) for line in block] == [
            "one", "two", "three", "four"]


class TestInputs:
    def test_missing_path_glob_and_empty_dir_are_named(self, tmp_path):
        with pytest.raises(InputNotFound, match="nope.txt"):
            io.list_inputs(str(tmp_path / "nope.txt"))
        with pytest.raises(InputNotFound, match=r"\*.log"):
            io.list_inputs(str(tmp_path / "*.log"))
        (tmp_path / "empty").mkdir()
        with pytest.raises(InputNotFound, match="no data files"):
            io.list_inputs(str(tmp_path / "empty"))
        os.mkfifo(tmp_path / "fifo")  # `actorpy wordcount /dev/stdin` is one too
        with pytest.raises(InputNotFound, match="fifo' is not a regular file or a directory"):
            io.list_inputs(str(tmp_path / "fifo"))
        os.symlink("loop", tmp_path / "loop")
        with pytest.raises(InputNotFound, match="loop' is a symbolic link to nothing"):
            io.list_inputs(str(tmp_path / "loop"))

    @staticmethod
    def _deny(monkeypatch, *denied):
        """``os.access`` says no for ``denied`` (as chmod 000 does for a user who is not
        root; these tests run as root too, which chmod does not stop)."""
        allowed = os.access
        names = {os.fspath(d) for d in denied}
        monkeypatch.setattr(os, "access", lambda path, mode, **kw: (
            os.fspath(path).rstrip(os.sep) not in names and allowed(path, mode, **kw)))

    def test_an_unreadable_input_file_is_refused_before_the_job(self, tmp_path, monkeypatch):
        # before: found by the worker reading it, after the other splits were counted
        for name in ("a.txt", "b.txt"):
            (tmp_path / name).write_text("x\n")
        self._deny(monkeypatch, tmp_path / "b.txt")
        with pytest.raises(InputNotFound, match="b.txt' cannot be read \\(permission denied"):
            io.list_inputs(str(tmp_path))

    @pytest.mark.parametrize("pattern", ["**/*.txt", "*/*.txt", "sub/*.txt", "**"])
    def test_a_pattern_through_an_unreadable_directory_is_refused(self, tmp_path, monkeypatch,
                                                                  pattern):
        # before: glob passed over it, as the shell does, and the count came out short with
        # exit status 0
        for name in ("a.txt", "sub/b.txt"):
            (tmp_path / name).parent.mkdir(exist_ok=True)
            (tmp_path / name).write_text("x\n")
        assert len(io.list_inputs(str(tmp_path / pattern))) >= 1
        self._deny(monkeypatch, tmp_path / "sub")
        with pytest.raises(InputNotFound, match="sub', which cannot be read"):
            io.list_inputs(str(tmp_path / pattern))
        assert io.list_inputs(str(tmp_path / "*.txt")) == [str(tmp_path / "a.txt")]

    def test_a_file_behind_a_directory_that_cannot_be_entered_is_not_called_missing(
            self, tmp_path, monkeypatch):
        (tmp_path / "sub").mkdir()
        (tmp_path / "sub" / "b.txt").write_text("x\n")
        inside = str(tmp_path / "sub" / "b.txt")
        stat = os.stat

        def no_entry(path, *args, **kwargs):   # what chmod 000 on sub does to a user
            if os.fspath(path) == inside:
                raise PermissionError(13, "Permission denied", inside)
            return stat(path, *args, **kwargs)

        monkeypatch.setattr(os, "stat", no_entry)
        with pytest.raises(InputNotFound, match="b.txt' cannot be reached: a directory on its "
                                                "way cannot be entered"):
            io.list_inputs(inside)      # before: "does not exist"

    @pytest.mark.skipif(not os.path.isfile("/proc/self/status"), reason="needs Linux's /proc")
    def test_a_kernel_file_of_size_0_is_refused_not_counted_empty(self, tmp_path):
        with pytest.raises(InputNotFound, match="status' reports a size of 0 but holds data"):
            io.list_inputs(["/proc/self/status"])
        (tmp_path / "empty.txt").write_bytes(b"")  # an empty file is just empty
        assert io.list_inputs(str(tmp_path / "empty.txt")) == [str(tmp_path / "empty.txt")]

    def test_absolute_paths_are_listed_from_a_deleted_directory(self, tmp_path, monkeypatch):
        # before: `actorpy wordcount /abs/file` run from a removed directory failed with
        # "[Errno 2] No such file or directory" (os.getcwd), naming nothing
        (tmp_path / "a.txt").write_text("x\n")
        (tmp_path / "gone").mkdir()
        monkeypatch.chdir(tmp_path / "gone")
        (tmp_path / "gone").rmdir()
        assert io.list_inputs([str(tmp_path / "a.txt")]) == [str(tmp_path / "a.txt")]

    def test_double_star_spans_directories(self, tmp_path):
        for name in ("t.txt", "a/m.txt", "a/b/d.txt", "a/b/skip.log"):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text("x\n")
        assert io.list_inputs(str(tmp_path / "**" / "*.txt")) == \
            [str(tmp_path / n) for n in ("a/b/d.txt", "a/m.txt", "t.txt")]

    def test_double_star_names_each_file_once_through_a_link_loop(self, tmp_path):
        (tmp_path / "a").mkdir()
        (tmp_path / "a" / "x.txt").write_text("x\n")
        os.symlink("..", tmp_path / "a" / "up")  # glob's ** walks a/up/a/up/... until ELOOP
        assert io.list_inputs(str(tmp_path / "**" / "*.txt")) == [str(tmp_path / "a" / "x.txt")]

    def test_a_file_named_like_a_pattern_does_not_hide_its_matches(self, tmp_path):
        # before: a file named "*.txt" was read alone, and a.txt and b.txt never were
        for name in ("*.txt", "a.txt", "b.txt"):
            (tmp_path / name).write_text("x\n")
        assert io.list_inputs(str(tmp_path / "*.txt")) == \
            [str(tmp_path / n) for n in ("*.txt", "a.txt", "b.txt")]
        assert io.list_inputs(glob.escape(str(tmp_path / "*.txt"))) == [str(tmp_path / "*.txt")]
        # a name with pattern characters that matches nothing else is read as a name
        (tmp_path / "log[1].txt").write_text("x\n")
        assert io.list_inputs(str(tmp_path / "log[1].txt")) == [str(tmp_path / "log[1].txt")]

    def test_paths_of_the_wrong_type_are_refused(self, tmp_path):
        (tmp_path / "a.txt").write_text("x\n")
        for bad in (str(tmp_path / "a.txt").encode(), None, 3, [str(tmp_path), None]):
            with pytest.raises(ArgumentError, match="takes paths as str or os.PathLike"):
                io.list_inputs(bad)
        assert io.list_inputs(tmp_path.glob("*.txt")) == [str(tmp_path / "a.txt")]

    def test_directory_skips_markers_and_temporaries(self, tmp_path):
        for name in ("b.txt", "a.txt", "_SUCCESS", ".part-00000.x.tmp"):
            (tmp_path / name).write_text("x\n")
        assert io.list_inputs(str(tmp_path)) == [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
        assert io.list_inputs([str(tmp_path / "b.txt"), str(tmp_path / "a*")]) == \
            [str(tmp_path / "b.txt"), str(tmp_path / "a.txt")]

    def test_splits_cover_each_file(self, tmp_path):
        (tmp_path / "a").write_bytes(b"x" * 10)
        (tmp_path / "b").write_bytes(b"")
        splits = io.make_splits([str(tmp_path / "a"), str(tmp_path / "b")], 4)
        assert [(s.start, s.end) for s in splits] == [(0, 3), (3, 6), (6, 10)]  # even, <= 4

    @given(st.lists(st.integers(0, 300), max_size=12), st.integers(1, 200), st.integers(1, 4))
    @settings(max_examples=200, deadline=None)
    def test_small_splits_share_a_partition(self, sizes, split_bytes, workers):
        splits = [Split(f"f{i}", 0, n) for i, n in enumerate(sizes)]
        parts = io.pack_splits(splits, split_bytes, workers)
        assert [s for part in parts for s in part] == splits  # each once, in order
        total = sum(sizes)
        limit = min(split_bytes, -(-total // workers))
        for i, part in enumerate(parts):
            size = sum(s.end - s.start for s in part)
            assert len(part) == 1 or size <= limit  # only a lone split may exceed the limit
            if i + 1 < len(parts):  # closed only when the next split would not fit
                assert size + parts[i + 1][0].end - parts[i + 1][0].start > limit
        if 0 < total and total >= workers * max(sizes, default=0):
            assert len(parts) >= min(workers, len(splits))  # every worker gets one


class TestOutput:
    def test_parts_are_renamed_into_place_and_marked(self, tmp_path):
        out = str(tmp_path / "out")
        io.prepare_output(out, overwrite=False)
        assert io.write_part(["a", 1, "ü"], out, 0) == (3, len("a\n1\nü\n".encode()))
        io.write_part([], out, 1)
        with open(os.path.join(out, ".part-00002.dead.tmp"), "w"):
            pass  # left by a worker that died mid-write
        io.finish_output(out, 2)
        assert sorted(os.listdir(out)) == ["_SUCCESS", "part-00000", "part-00001"]
        with pytest.raises(OutputExists, match="is a file, not a directory"):
            io.prepare_output(os.path.join(out, "part-00000"), overwrite=True)
        with pytest.raises(OutputExists, match="overwrite=True"):
            io.prepare_output(out, overwrite=False)
        io.prepare_output(out, overwrite=True)
        assert os.listdir(out) == []

    def test_overwrite_replaces_only_a_previous_save(self, tmp_path):
        # before: save("/", overwrite=True) wrote its parts next to /etc, removing only
        # part-* and _SUCCESS, and a later load of the directory read every other file
        out = str(tmp_path / "out")
        io.prepare_output(out, overwrite=False)
        io.write_part(["a"], out, 0)
        io.finish_output(out, 1)
        others = ["notes.txt", "part-00001.bak", ".hidden", "sub", "zz"]
        for name in others[:3] + others[4:]:
            with open(os.path.join(out, name), "w"):
                pass
        os.mkdir(os.path.join(out, "sub"))
        with pytest.raises(OutputExists) as info:
            io.prepare_output(out, overwrite=True)
        assert str(info.value).startswith(
            f"output directory {out!r} holds entries no save wrote ('.hidden', 'notes.txt', "
            "'part-00001.bak' and 2 more)")
        assert sorted(os.listdir(out)) == sorted(others + ["_SUCCESS", "part-00000"])
        for name in others[:3] + others[4:]:
            os.remove(os.path.join(out, name))
        os.rmdir(os.path.join(out, "sub"))
        io.prepare_output(out, overwrite=True)
        assert os.listdir(out) == []

    def test_a_directory_that_cannot_be_written_to_is_refused_before_any_work(
            self, tmp_path, monkeypatch):
        # before: the first worker to write a part failed, after the work upstream was done
        out = str(tmp_path / "ro")
        os.mkdir(out)
        allowed = os.access
        monkeypatch.setattr(os, "access", lambda path, mode, **kw: (   # chmod 555, as a user
            not (os.fspath(path) == out and mode & os.W_OK) and allowed(path, mode, **kw)))
        with pytest.raises(OutputExists, match="ro' cannot be written to \\(permission denied"):
            io.prepare_output(out, overwrite=False)

    def test_a_part_that_cannot_be_written_is_named(self, tmp_path):
        # a full disk's "[Errno 28] No space left on device" named no file (save's error
        # said only which partition); the file-size limit fails a write the same way
        out = str(tmp_path / "out")
        io.prepare_output(out, overwrite=False)
        child = (
            "import resource, signal, sys\n"
            "from engines.mapre import io\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
            "try:\n"
            "    io.write_part(['x' * 100] * 1000, sys.argv[1], 3)\n"
            "except OSError as exc:\n"
            "    print(exc)\n")
        done = subprocess.run([sys.executable, "-c", child, out], capture_output=True,
                              text=True, timeout=60, cwd=ROOT)
        assert done.stdout.strip() == (f"[Errno {errno.EFBIG}] {os.strerror(errno.EFBIG)}: "
                                       f"{os.path.join(out, 'part-00003')!r}"), done.stderr
        assert os.listdir(out) == []   # no temporary left behind

