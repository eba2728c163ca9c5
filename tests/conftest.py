"""Shared test hygiene: conditions waited on with timeouts (never sleep), no child
process left behind by any test, no per-example deadline for Hypothesis, Ctrl-C delivered
even when the suite runs as a background job."""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable

import pytest
from hypothesis import settings

# Hypothesis fails an example that takes over 200 ms by default: a timing assertion that a
# loaded 2-core machine fails at random (print_json took 443 ms in a suite beside others).
# No test here means it: examples are bounded by their count and pytest-timeout instead.
settings.register_profile("actorpy", deadline=None)
settings.load_profile("actorpy")

# A suite started as a background job (`cmd &`, nohup) inherits SIGINT ignored, and Python
# then raises no KeyboardInterrupt, here or in the drivers the tests start: the Ctrl-C
# tests waited out their timeouts. They test Ctrl-C as a terminal delivers it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str,
               interval_s: float = 0.02) -> object:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    tick = threading.Event()
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        tick.wait(interval_s)


def child_pids(pid: int | None = None) -> set[int]:
    """Live children of ``pid`` (default: this process), from /proc."""
    pid = os.getpid() if pid is None else pid
    found: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.update(int(p) for p in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return {p for p in found if alive(p)}


def catches_signal(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (Linux's /proc)."""
    with open(f"/proc/{pid}/status") as f:
        caught = next(line for line in f if line.startswith("SigCgt:")).split()[1]
    return bool(int(caught, 16) >> (sig - 1) & 1)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.fixture(autouse=True)
def no_orphans():
    """Every test must leave no child process running."""
    before = child_pids()
    yield
    leftover = lambda: child_pids() - before  # noqa: E731
    deadline = time.monotonic() + 10
    tick = threading.Event()
    while leftover() and time.monotonic() < deadline:
        tick.wait(0.05)
    assert not leftover(), f"test left child processes running: {sorted(leftover())}"
