"""The child process side of a runner: read a request, time the solver call, measure its memory.

A child serves pickled requests on stdin with pickled results on stdout (``_serve_stdio``); the parent
side is :mod:`benchmarks.bench.runner`.
"""

from __future__ import annotations

import gc
import os
import pickle
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

from benchmarks.bench.methods import _OUR_CALLS, SCALE


def _serve_stdio() -> None:
    """Child main loop: pickled requests on stdin, pickled results on the original stdout."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints from libraries go to stderr, never into the protocol
    requests = sys.stdin.buffer
    while True:
        try:
            request = pickle.load(requests)
        except EOFError:
            return
        pickle.dump(_handle(request), replies)
        replies.flush()


def _handle(request: dict) -> dict:
    """Run one request in the child: prepare the call, then time it (refusals are results, not crashes)."""
    try:
        call = _prepare(request["method"], request["weights"], request["values"], request["capacity"])
        _set_torch_threads(request["method"], request["torch_threads"])
    except ImportError as error:
        return {"status": "n/a", "note": f"n/a ({error})"}
    try:
        return _timed_calls(call, request["repeat_budget_s"], request["max_repeats"])
    except (MemoryError, ValueError) as error:
        return {"status": "refused", "note": "refused: " + " ".join(str(error).split())}
    except Exception as error:  # a benchmark reports every failure in its table and carries on
        return {"status": "error", "note": f"error: {type(error).__name__}: {error}"}


def _prepare(method: str, weights: list[int], values: list[float], capacity: int) -> Callable[[], Sequence]:
    """A zero-argument call of ``method`` that returns the chosen indices; inputs converted beforehand."""
    if method.startswith("torch-"):
        from torch._functorch._activation_checkpointing import knapsack

        solve = knapsack.dp_knapsack if method == "torch-dp" else knapsack.dp_knapsack_sliding_hirschberg
        memory, runtimes, budget = [w / SCALE for w in weights], [float(v) for v in values], capacity / SCALE
        return lambda: solve(memory, runtimes, budget)[1]
    from lightning_ckpt.solver import SolverOptions, solve_knapsack

    solver_method, workers, fields = _OUR_CALLS[method]
    options = SolverOptions(**fields)
    weights_array, values_array = np.asarray(weights, dtype=np.int64), np.asarray(values, dtype=np.float64)
    return lambda: (
        solve_knapsack(
            weights_array, values_array, capacity, method=solver_method, workers=workers, options=options
        ).chosen
    )


def _set_torch_threads(method: str, threads: int) -> None:
    """Pin torch's intra-op threads (0: its default); 2 threads on a shared 2-core box time erratically."""
    if method.startswith("torch-") and threads > 0:
        import torch

        torch.set_num_threads(threads)


def _timed_calls(call: Callable[[], Sequence], repeat_budget_s: float, max_repeats: int) -> dict:
    """Best time of repeated calls (until ``repeat_budget_s`` is spent), the least CPU time of this
    process (all its threads) over them, and their largest RSS growth."""
    times_s: list[float] = []
    cpus_s: list[float] = []
    peaks_bytes: list[int | None] = []
    gc.collect()
    while True:
        can_reset = _reset_peak_rss()
        baseline_kb = _status_kb(os.getpid(), "VmRSS")
        start, cpu_start = time.perf_counter(), time.process_time()
        chosen = call()
        times_s.append(time.perf_counter() - start)
        cpus_s.append(time.process_time() - cpu_start)
        peaks_bytes.append(
            1024 * max(0, _status_kb(os.getpid(), "VmHWM") - baseline_kb) if can_reset else None
        )
        if len(times_s) >= max_repeats or sum(times_s) >= repeat_budget_s:
            break
    known = [p for p in peaks_bytes if p is not None]
    return {
        "status": "ok",
        "time_s": min(times_s),
        "cpu_s": min(cpus_s),
        "repeats": len(times_s),
        "self_peak_bytes": max(known) if known else None,
        "chosen": [int(i) for i in chosen],
    }


def _reset_peak_rss() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS (Linux >= 4.0); False where impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _status_kb(pid: int, key: str) -> int:
    """A ``kB`` field of ``/proc/<pid>/status`` (0 if unreadable)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
