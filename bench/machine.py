"""What the machine did while a benchmark ran, for reading its figures: the share of CPU time
busy and stolen by the hypervisor (a virtual machine's neighbours), from ``/proc/stat``, and
the load average. A run on a machine that lost a third of its CPU to steal is not comparable
with a quiet one; the ratios within the run are what the benchmarks compare.

>>> watch = CpuWatch()
>>> isinstance(watch.summary(), str)
True
"""
from __future__ import annotations

import os


def _cpu_times() -> list[int] | None:
    """The first line of ``/proc/stat`` (user nice system idle iowait irq softirq steal ...),
    in clock ticks since boot; None where there is none (not Linux)."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    return [int(f) for f in fields[1:9]]


class CpuWatch:
    """CPU time spent since it was made (or since ``summary``, which starts a new interval)."""

    def __init__(self) -> None:
        self._start = _cpu_times()

    def summary(self) -> str:
        """One line: the CPU busy and stolen since the last call, and the load average."""
        start, end = self._start, _cpu_times()
        self._start = end
        load = f"load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
        if start is None or end is None:
            return f"machine: {load}"
        delta = [b - a for a, b in zip(start, end)]
        total = sum(delta) or 1
        idle = delta[3] + delta[4]
        steal = delta[7]
        return (f"machine meanwhile: CPU {100 * (total - idle - steal) / total:.0f} % busy, "
                f"{100 * steal / total:.0f} % stolen by the hypervisor, {load}")
