"""Datasets from files, saving, caching, broadcasts, errors and clean-up, on a shared cluster."""
from __future__ import annotations

import gc
import operator
import os
import threading
import unicodedata
import uuid

import numpy as np
import pytest

import actorpy
from actorpy.errors import ActorpyTimeout, ConfigError, RemoteError
from engines import mapre
from engines.mapre.progress import Progress
from tests.conftest import wait_until
from tests.mapre.conftest import stored_keys


def job_keys(cluster) -> int:
    return stored_keys(cluster, f"mapre/{cluster.node_id}-j")


class TestLoad:
    def test_unicode_crlf_and_nbsp_across_splits(self, cluster, tmp_path):
        nfc = "café crème"
        nfd = unicodedata.normalize("NFD", nfc)
        lines = [nfc, nfd, "a\u00a0b c", "", "日本語 テキスト", "tab\there"] * 50
        (tmp_path / "one.txt").write_bytes("\r\n".join(lines).encode() + b"\r\n")
        (tmp_path / "two.txt").write_bytes("\n".join(lines).encode())
        d = mapre.load(cluster, str(tmp_path / "*.txt"), split_bytes=97)
        assert d.partitions > 10
        assert d.collect(timeout_s=60) == lines + lines
        words = d.flat_map(str.split).map(lambda w: (w, 1)).reduce_by_key(operator.add)
        expected: dict = {}
        for w in (w for line in lines + lines for w in line.split()):
            expected[w] = expected.get(w, 0) + 1
        assert dict(words.collect(timeout_s=60)) == expected
        assert expected[nfc.split()[0]] == expected[nfd.split()[0]] == 100  # NFC != NFD
        # a numpy integer is a split size (before: "split_bytes must be an integer >= 1")
        same = mapre.load(cluster, str(tmp_path / "*.txt"), split_bytes=np.int64(97))
        assert same.partitions == d.partitions and same.collect(timeout_s=60) == lines + lines

    def test_small_files_share_partitions(self, cluster, tmp_path):
        files = [[f"file {i} line {j}" for j in range(i % 4)] for i in range(40)]
        for i, lines in enumerate(files):
            (tmp_path / f"{i:02d}.txt").write_text("".join(f"{x}\n" for x in lines))
        d = mapre.load(cluster, str(tmp_path))
        assert 2 <= d.partitions <= 3  # 40 small files: about one partition per worker
        assert d.collect(timeout_s=60) == [x for lines in files for x in lines]
        sizes = d.map_partitions(lambda it: [sum(1 for _ in it)]).collect(timeout_s=60)
        assert sum(sizes) == sum(map(len, files)) and min(sizes) > 0

    def test_a_single_50_mb_line(self, cluster, tmp_path):
        big = ("0123456789abcdef" * (50_000_000 // 16 + 1))[:50_000_000]
        path = tmp_path / "big.txt"
        with open(path, "w") as f:
            f.write("head\n" + big + "\ntail\n")
        d = mapre.load(cluster, str(path), split_bytes=8 << 20)
        assert d.map(len).collect(timeout_s=120) == [4, 50_000_000, 4]
        got = d.filter(lambda line: len(line) > 10).collect(timeout_s=120)
        assert len(got) == 1 and got[0] == big

    def test_text_blocks_of_a_single_long_line_stay_small(self, cluster, tmp_path):
        # the line used to be one block: held whole (several times) by the worker reading it
        path = tmp_path / "one.txt"
        path.write_text(" ".join(f"w{i % 1000}" for i in range(2_000_000)), encoding="utf-8")
        d = mapre.load(cluster, str(path), lines=False, cut_long_lines=True, split_bytes=4 << 20)
        sizes = d.map_partitions(lambda blocks: [max(map(len, blocks), default=0)])
        assert 0 < max(sizes.collect(timeout_s=120)) <= (64 << 10) + 4  # and a word
        assert d.flat_map(str.split).count(timeout_s=120) == 2_000_000
        with pytest.raises(ConfigError, match="cut_long_lines=True needs lines=False"):
            mapre.load(cluster, str(path), cut_long_lines=True)

    def test_relative_paths_are_the_drivers(self, cluster, tmp_path, monkeypatch):
        # the workers started in another directory (as `actorpy worker` elsewhere would)
        monkeypatch.chdir(tmp_path)
        (tmp_path / "sub dir").mkdir()
        (tmp_path / "sub dir" / "rel.txt").write_text("here\n")
        assert mapre.load(cluster, "sub dir/rel.txt").collect(timeout_s=60) == ["here"]
        assert mapre.load(cluster, ["sub dir"]).collect(timeout_s=60) == ["here"]

    def test_missing_input_fails_before_any_work(self, cluster, tmp_path):
        with pytest.raises(mapre.InputNotFound, match="nothing-here"):
            mapre.load(cluster, str(tmp_path / "nothing-here" / "*.txt"))
        with pytest.raises(FileNotFoundError, match="missing.txt"):
            mapre.load(cluster, [str(tmp_path / "missing.txt")])

    def test_undecodable_input_names_file_and_offset(self, cluster, tmp_path):
        path = tmp_path / "latin1.txt"
        path.write_bytes(b"fine\n" * 1000 + b"caf\xe9\n")
        with pytest.raises(RemoteError) as info:
            mapre.load(cluster, str(path), split_bytes=1000).count(timeout_s=60)
        assert f"{path}: byte offset 5003 is not valid UTF-8" in str(info.value)
        assert isinstance(info.value.__cause__, mapre.InputDecodeError)
        assert info.value.__cause__.offset == 5003
        replaced = mapre.load(cluster, str(path), errors="replace").collect(timeout_s=60)
        assert replaced[-1] == "caf\ufffd" and len(replaced) == 1001


class TestSave:
    def test_round_trip_keeps_order_and_marks_success(self, cluster, tmp_path):
        data = [f"line {i} ü" for i in range(100)]
        out = tmp_path / "out"
        d = mapre.from_items(cluster, data, partitions=5)
        assert d.save(str(out), timeout_s=60) == str(out)
        assert sorted(os.listdir(out)) == ["_SUCCESS"] + [f"part-{i:05d}" for i in range(5)]
        assert mapre.load(cluster, str(out)).collect(timeout_s=60) == data
        with pytest.raises(mapre.OutputExists):
            d.save(str(out))
        d.map(str.upper).save(str(out), overwrite=True, timeout_s=60)
        assert mapre.load(cluster, str(out)).collect(timeout_s=60) == [s.upper() for s in data]

    def test_a_directory_that_names_nothing_is_refused(self, cluster, tmp_path, monkeypatch):
        # "" was the driver's current directory: parts landed there (once it was empty)
        monkeypatch.chdir(tmp_path)
        d = mapre.from_items(cluster, range(4), partitions=2)
        for bad in ("", b"out", None):
            with pytest.raises(mapre.ArgumentError, match="save\\(\\) takes a directory"):
                d.save(bad, timeout_s=60)
        assert os.listdir(tmp_path) == []

    def test_empty_dataset_saves_and_loads(self, cluster, tmp_path):
        out = str(tmp_path / "empty")
        mapre.from_items(cluster, [], partitions=2).save(out, timeout_s=60)
        assert mapre.load(cluster, out).collect(timeout_s=60) == []


    def test_overwriting_its_own_input_is_refused(self, cluster, tmp_path):
        # overwrite=True deleted the parts before the job read them: the input was lost
        out = str(tmp_path / "out")
        mapre.from_items(cluster, range(10), 2).save(out)
        doubled = mapre.load(cluster, out).map(lambda line: str(int(line) * 2))
        with pytest.raises(mapre.OutputExists, match="holds files this dataset reads"):
            doubled.save(out, overwrite=True, timeout_s=60)
        assert mapre.load(cluster, out).collect(timeout_s=60) == [str(x) for x in range(10)]
        assert doubled.save(str(tmp_path / "other"), timeout_s=60)


class TestCache:
    def test_second_action_reads_the_cache(self, cluster, tmp_path):
        def mark(it):
            (tmp_path / uuid.uuid4().hex).touch()
            return [x * 2 for x in it]
        d = mapre.from_items(cluster, range(100), partitions=4).map_partitions(mark).cache()
        assert not d.is_cached
        assert d.count(timeout_s=60) == 100 and d.is_cached
        assert d.collect(timeout_s=60) == [x * 2 for x in range(100)]
        assert d.map(lambda x: (x % 3, x)).reduce_by_key(operator.add).count(timeout_s=60) == 3
        assert len(os.listdir(tmp_path)) == 4  # computed once per partition
        assert stored_keys(cluster, "mapre/cache/") >= 4
        d.unpersist()
        assert stored_keys(cluster, "mapre/cache/") == 0
        assert d.count(timeout_s=60) == 100 and not d.is_cached
        assert len(os.listdir(tmp_path)) == 8

    def test_a_forgotten_cache_is_freed(self, cluster):
        d = mapre.from_items(cluster, range(1000), 3).map(lambda x: -x).cache()
        assert d.count(timeout_s=60) == 1000
        prefix = d._node.key_prefix + "/"
        assert stored_keys(cluster, prefix) == 3
        del d
        gc.collect()
        wait_until(lambda: stored_keys(cluster, prefix) == 0, 10, "the cache to be freed")

    def test_blocks_are_deleted_when_jobs_end(self, cluster):
        d = mapre.from_items(cluster, range(20_000), 4).map(lambda x: (x % 5000, x))
        assert len(d.group_by_key(3).sort_by(lambda kv: kv[0]).collect(timeout_s=60)) == 5000
        assert job_keys(cluster) == 0
        it = d.reduce_by_key(operator.add, 3).iterate(timeout_s=60)
        next(it)
        it.close()  # abandoned half way
        assert job_keys(cluster) == 0

    def test_broadcast_is_read_in_tasks(self, cluster):
        table = mapre.broadcast(cluster, {i: i * i for i in range(1000)})
        d = mapre.from_items(cluster, range(1000), 3)
        assert d.map(lambda i: table.value[i]).collect(timeout_s=60) == [i * i for i in range(1000)]
        assert table.value[9] == 81 and stored_keys(cluster, table.key) == len(cluster.workers())
        table.unpersist()
        assert stored_keys(cluster, table.key) == 0


class TestErrors:
    def test_user_error_names_stage_partition_and_node(self, cluster):
        def risky(x):
            return 10 // (x - 7)
        d = mapre.from_items(cluster, range(10), partitions=3).map(risky)
        with pytest.raises(RemoteError) as info:
            d.map(lambda x: (x, 1)).reduce_by_key(operator.add).collect(timeout_s=60)
        err = info.value
        assert err.remote_type == "ZeroDivisionError"
        assert "stage 'reduce_by_key (map side)'" in str(err) and "partition 2" in str(err)
        assert "from_items -> map(" in str(err) and err.node_id in cluster.workers()
        assert "in risky" in err.remote_traceback
        assert isinstance(err.__cause__, ZeroDivisionError)
        assert job_keys(cluster) == 0  # a failed job cleans up too

    def test_a_huge_message_arrives_cut(self, cluster):
        # before: the whole 3 MB came back twice in the error's text (message, traceback)
        def huge(x):
            raise ValueError("x" * 3_000_000 + " on purpose")
        with pytest.raises(RemoteError) as info:
            mapre.from_items(cluster, [1], 1).map(huge).collect(timeout_s=60)
        assert "x on purpose (in stage 'collect'" in info.value.remote_message
        assert "characters cut" in info.value.remote_message and len(str(info.value)) < 20_000

    def test_timeout_is_a_timeout_error(self, cluster):
        slow = mapre.from_items(cluster, [1.0], 1).map(lambda s: threading.Event().wait(s))
        with pytest.raises(TimeoutError, match="did not finish within 0.2 s"):
            slow.collect(timeout_s=0.2)
        with pytest.raises(ActorpyTimeout):
            slow.count(timeout_s=0.1)
        for bad in (float("nan"), "10", None):  # NaN never timed out
            with pytest.raises(mapre.ArgumentError, match="timeout_s must be a number"):
                slow.count(timeout_s=bad)

    def test_a_timeout_that_is_no_time_limit_is_refused_everywhere(self, cluster, tmp_path):
        # before: -1 or 0 failed at once as "did not finish within -1 s", unpersist took it,
        # broadcast said no worker took the value, and inf waited for ever on a hung task
        d = mapre.from_items(cluster, [3, 1, 2], 2)
        cached, shared = d.cache(), mapre.broadcast(cluster, 1)
        out = tmp_path / "out"
        calls = [("collect", lambda t: d.collect(timeout_s=t)),
                 ("iterate", lambda t: d.iterate(timeout_s=t)),
                 ("count", lambda t: d.count(timeout_s=t)),
                 ("reduce", lambda t: d.reduce(operator.add, timeout_s=t)),
                 ("fold", lambda t: d.fold(0, operator.add, timeout_s=t)),
                 ("reduce_by_key_locally", lambda t: d.map(lambda x: (x, 1))
                  .reduce_by_key_locally(operator.add, timeout_s=t)),
                 ("take", lambda t: d.take(1, timeout_s=t)),
                 ("top", lambda t: d.top(1, timeout_s=t)),
                 ("save", lambda t: d.save(out, timeout_s=t)),
                 ("unpersist", lambda t: cached.unpersist(timeout_s=t)),
                 ("broadcast", lambda t: mapre.broadcast(cluster, 1, timeout_s=t)),
                 ("unpersist", lambda t: shared.unpersist(timeout_s=t))]
        for what, call in calls:
            for bad in (-1, -0.5, 0, float("-inf"), float("inf")):
                with pytest.raises(mapre.ArgumentError,
                                   match=f"^{what}: timeout_s must be a number of seconds, "
                                         f"finite and > 0, got {bad!r}$"):
                    call(bad)
        assert not out.exists() and d.top(2, timeout_s=60) == [3, 2]
        # a numpy number is a number of seconds (np.int64 was refused as no number)
        assert d.top(2, timeout_s=np.int64(60)) == [3, 2] == d.top(2, timeout_s=np.float32(60))

    def test_a_timed_out_job_leaves_no_queued_tasks(self, tmp_path):
        # a hung user function times out; its partitions still queued on the workers must
        # not run after it (keeping the workers busy for the next action), only those
        # already running can go on (a thread cannot be stopped). A cluster of its own: no
        # other test's task may hold a slot (one per worker, and one task queued)
        marks = tmp_path / "marks"
        marks.mkdir()

        def stuck(x):
            (marks / str(x)).touch()
            for _ in range(300):  # waits (at most 30 s) for the test's gate
                if (tmp_path / "go").exists():
                    break
                threading.Event().wait(0.1)
            return x
        with actorpy.connect(workers=2) as cluster:
            with pytest.raises(ActorpyTimeout):
                mapre.from_items(cluster, range(12), 12).map(stuck).collect(timeout_s=3)
            started = len(os.listdir(marks))
            assert started <= 2  # (fewer only on a machine too loaded to start them in 3 s)
            (tmp_path / "go").touch()
            assert mapre.from_items(cluster, range(8), 8).count(timeout_s=60) == 8
        assert len(os.listdir(marks)) == started


    def test_a_given_up_job_stops_reading_its_input(self, tmp_path):
        # Ctrl-C or a timeout cancels the job's tasks: a running one used to read all its
        # input on, holding its worker (27 s for the next job after a Ctrl-C'd wordcount)
        marks = tmp_path / "marks"
        marks.mkdir()
        path = tmp_path / "in.txt"
        path.write_text(("word " * 1000 + "\n") * 400, encoding="utf-8")  # 2 MB: 31 blocks

        def slow(block):
            (marks / str(len(os.listdir(marks)))).touch()
            for _ in range(300):  # waits (at most 30 s) for the test's gate
                if (tmp_path / "go").exists():
                    break
                threading.Event().wait(0.1)
            return len(block)
        with actorpy.connect(workers=1) as cluster:
            with pytest.raises(ActorpyTimeout):
                mapre.load(cluster, str(path), lines=False).map(slow).count(timeout_s=2)
            (tmp_path / "go").touch()
            # one thread: this runs once the given-up task has ended
            assert mapre.from_items(cluster, range(4), 1).count(timeout_s=60) == 4
        assert len(os.listdir(marks)) == 1


class TestProgress:
    def test_bar_shows_stage_and_partitions(self, capsys):
        progress = Progress("collect", True, 2, delay_s=0)
        progress.stage("reduce_by_key (map side)", 3)
        for _ in range(3):
            progress.advance(rows=1000, nbytes=1 << 20)
        line = str(progress._bar)
        progress.close()
        assert "collect stage 1/2 reduce_by_key" in capsys.readouterr().err
        assert "3/3" in line and "rows/s" in line and "MB/s" in line

    def test_silent_when_disabled(self, cluster, capsys, monkeypatch):
        monkeypatch.setenv("ACTORPY_PROGRESS", "0")
        assert mapre.from_items(cluster, range(10), 2).count(timeout_s=60, progress=None) == 10
        assert capsys.readouterr().err == ""
