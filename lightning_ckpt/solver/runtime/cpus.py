"""How many processes a parallel solve should use: from the instance and from the CPUs idle now.

A second process pays only when it gets a CPU of its own: on a machine whose CPUs are all busy it
competes with the caller (and with everyone else) and the solve gets slower, not faster
(``python -m benchmarks.bench.workers`` measures both). So before starting workers the solver looks:

- ``usable_cpus()``: the CPUs this process may run on (``sched_getaffinity``), capped by a cgroup v2
  CPU quota (``cpu.max``, as containers set it);
- ``idle_cpus()``: how many of those no other thread wants: the machine's runnable threads
  (``/proc/loadavg``, the median of a few looks over ``IDLE_PROBE_S``), less the one looking,
  scaled to this process's share of the machine's CPUs;
- ``room_for(processes)``: whether that many processes (the caller among them) each find a CPU
  at least ``IDLE_SHARE`` idle now;
- ``processes_for(requested, cells, min_cells)``: the one decision both dense engines take, from
  the instance and from the CPUs: ``requested`` processes when the solve has at least ``min_cells``
  DP cells (``SolverOptions.parallel_min_solve_cells``, 2^29: where a second process paid on 2 idle
  CPUs) and ``room_for`` them, else 1 (the answer is the same: the solver is exact, and
  ``SolveStats.workers_used`` says 1). ``min_cells=0`` forces the workers on every solve, busy
  machine or not (tests, benchmarks).

Where ``/proc/loadavg`` is missing (not Linux) the CPUs count as idle: the requested processes run.

Example:
    >>> room_for(1), processes_for(2, cells=10**6, min_cells=1 << 29), processes_for(2, 10**6, 0)
    (True, 1, 2)
    >>> usable_cpus() >= 1 and 0.0 <= idle_cpus() <= usable_cpus()
    True
"""

from __future__ import annotations

import math
import os
import statistics
import time
from pathlib import Path

__all__ = ["IDLE_PROBE_S", "IDLE_SHARE", "idle_cpus", "processes_for", "room_for", "usable_cpus"]

IDLE_PROBE_S = 0.004
"""Seconds over which the run queue is looked at (once per solve of at least ``min_cells``)."""
IDLE_SHARE = 0.75
"""The share of a CPU that must be idle for it to count for one more process."""

_CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cpus() -> int:
    """CPUs this process may use: its affinity set, capped by a cgroup v2 quota (at least 1)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = _CGROUP_CPU_MAX.read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(cpus, 1)


def idle_cpus(probe_s: float = IDLE_PROBE_S) -> float:
    """CPUs of this process's affinity set that no other runnable thread wants, measured over
    ``probe_s`` seconds (all of them where ``/proc/loadavg`` is missing)."""
    usable = usable_cpus()
    samples = []
    for k in range(_SAMPLES):
        runnable = _runnable_threads()
        if runnable is None:
            return float(usable)
        samples.append(runnable - 1)  # the thread reading is one of them
        if k + 1 < _SAMPLES:
            time.sleep(probe_s / (_SAMPLES - 1))
    online = os.cpu_count() or usable
    others_here = statistics.median(samples) * min(usable / online, 1.0)  # the share on our CPUs
    return max(float(usable) - others_here, 0.0)


def room_for(processes: int) -> bool:
    """Whether ``processes`` processes (the caller among them) each find a CPU that no other
    runnable thread wants, now (each at least ``IDLE_SHARE`` idle)."""
    return processes <= 1 or idle_cpus() + (1 - IDLE_SHARE) >= processes


def processes_for(requested: int, cells: int, min_cells: int) -> int:
    """Processes a dense solve of ``cells`` DP cells runs on (this one included): ``requested`` when
    ``min_cells`` is 0 (forced), or when ``cells >= min_cells`` and ``room_for(requested)``; else 1.
    The CPUs are looked at only for a solve that is large enough."""
    if requested <= 1:
        return 1
    if min_cells == 0:
        return requested
    return requested if cells >= min_cells and room_for(requested) else 1


_SAMPLES = 5  # looks at the run queue per probe (median)


def _runnable_threads() -> int | None:
    """Threads runnable on the whole machine now (the 4th field of ``/proc/loadavg``, ``R/T``)."""
    try:
        return int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None
