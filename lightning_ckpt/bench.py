"""``lightning-ckpt bench``: our knapsack solvers against PyTorch's, side by side on the same instances.

Every method runs in its own persistent child process (one per method, started once, warmed up on a tiny
instance so imports and JIT compilation are not timed), called the same way: the child times only the
solver call with ``time.perf_counter`` and repeats short calls (best of up to 5 calls while they
take under 0.25 s in all; 3 s for ``--targets``).

Peak memory is the growth over the pre-call baseline of the child's exact resident high-water mark
(``VmHWM``, reset before each call through ``/proc/self/clear_refs``), and, when the child has processes
of its own (solver workers), of the proportional set size of its whole process tree, sampled every 5 to
100 ms, whichever is larger. It counts numpy, numba, torch and shared-memory pages alike. The children run
with ``MALLOC_MMAP_THRESHOLD_`` fixed, so that freed large arrays go back to the system and the next
call's growth is measured in full.

Feasibility and value are recomputed here from the returned indices (integer weights, float64 values);
the gap is relative to the best feasible value of any exact method on the same instance.

Example:
    >>> report = run_grid(["A"], [8], [40], ["greedy"], options=BenchOptions(progress=False))
    >>> [(row.method, row.status, row.feasible) for row in report.rows]
    [('greedy', 'ok', True)]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import os
import pickle
import platform
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from lightning_ckpt.solver import instances as solver_instances

SCALE = 10_000  # torch's knapsack functions multiply float weights by this and round
TORCH_REFERENCE = "torch-sliding"
DEFAULT_N = (100, 500, 1000, 2000)
DEFAULT_W = (10**5, 10**6, 10**7)
PAPER_W = (140_000_000, 380_000_000)
MAX_REPEATS = 5
BYTES_PER_MB = 1e6


@dataclass(frozen=True)
class _Method:
    """How a method is called and costed: ``dense`` methods do O(n*W) work, the others O(n)-ish."""

    name: str
    needs: tuple[str, ...]  # modules it imports
    exact: bool
    dense: bool
    table_bytes_per_cell: int  # 0 for O(W) methods
    prior_seconds_per_cost: float  # time estimate before anything was measured


_OURS, _TORCH, _SCIPY = ("lightning_ckpt.solver",), ("torch",), ("scipy", "lightning_ckpt.solver")
METHODS = {
    m.name: m
    for m in (
        _Method("hirschberg", _OURS, True, True, 0, 1e-9),
        _Method("hirschberg-w2", _OURS, True, True, 0, 1e-9),
        _Method("auto", _OURS, True, True, 0, 1e-9),
        _Method("dp", _OURS, True, True, 8, 1e-9),  # float64 table
        _Method("torch-dp", _TORCH, True, True, 4, 2e-9),  # float32 table
        _Method("torch-sliding", _TORCH, True, True, 0, 2e-9),
        _Method("greedy", _OURS, False, False, 0, 1e-6),
        _Method("ilp", _SCIPY, True, False, 0, 1e-3),
    )
}
_OUR_CALLS = {
    "hirschberg": ("hirschberg", 1),
    "hirschberg-w2": ("hirschberg", 2),
    "auto": ("auto", 1),
    "dp": ("dp", 1),
    "greedy": ("greedy", 1),
    "ilp": ("ilp", 1),
}


FAMILIES = solver_instances.FAMILIES


@dataclass(frozen=True, eq=False)
class KnapsackInstance:
    """One seeded instance: integer ``weights``, float ``values`` and the ``capacity`` W."""

    family: str
    n: int
    capacity: int
    seed: int
    weights: np.ndarray
    values: np.ndarray

    @property
    def cells(self) -> int:
        """Cells of the dense DP, ``n * W``: the work unit of Gcell/s."""
        return self.n * self.capacity


def make_instance(family: str, n: int, capacity: int, seed: int = 0) -> KnapsackInstance:
    """The instance of ``family`` from the solver's generators (``lightning_ckpt.solver.instances``).

    Example:
        >>> instance = make_instance("B", 4, 100, seed=1)
        >>> instance.weights.dtype, instance.cells
        (dtype('int64'), 400)
    """
    weights, values, _ = solver_instances.make_instance(family, n_items=n, capacity=capacity, seed=seed)
    return KnapsackInstance(
        family, n, capacity, seed, np.asarray(weights, np.int64), np.asarray(values, float)
    )


_WARM_UP_LARGE = {"hirschberg-w2": (400, 1_000_000)}  # n, W: above the solver's threshold for workers


@dataclass
class BenchRow:
    """One method on one instance. ``status`` is ok, skipped, refused, n/a, timeout or error."""

    family: str
    n: int
    capacity: int
    method: str
    status: str
    note: str = ""
    time_s: float | None = None
    estimated_time_s: float | None = None
    repeats: int = 0
    peak_bytes: int | None = None
    value: float | None = None
    weight: int | None = None
    feasible: bool | None = None
    gap: float | None = None
    speedup_vs_torch: float | None = None
    speedup_is_estimate: bool = False
    gcells_per_s: float | None = None


# ----------------------------------------------------------------------------------- child process side


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
    from lightning_ckpt.solver import solve_knapsack

    solver_method, workers = _OUR_CALLS[method]
    weights_array, values_array = np.asarray(weights, dtype=np.int64), np.asarray(values, dtype=np.float64)
    return lambda: (
        solve_knapsack(weights_array, values_array, capacity, method=solver_method, workers=workers).chosen
    )


def _set_torch_threads(method: str, threads: int) -> None:
    """Pin torch's intra-op threads (0: torch's default); 2 threads on a shared 2-core box time erratically."""
    if method.startswith("torch-") and threads > 0:
        import torch

        torch.set_num_threads(threads)


def _timed_calls(call: Callable[[], Sequence], repeat_budget_s: float, max_repeats: int) -> dict:
    """Best time of repeated calls (until ``repeat_budget_s`` is spent) and their largest RSS growth."""
    times_s: list[float] = []
    peaks_bytes: list[int | None] = []
    gc.collect()
    while True:
        can_reset = _reset_peak_rss()
        baseline_kb = _status_kb(os.getpid(), "VmRSS")
        start = time.perf_counter()
        chosen = call()
        times_s.append(time.perf_counter() - start)
        peaks_bytes.append(
            1024 * max(0, _status_kb(os.getpid(), "VmHWM") - baseline_kb) if can_reset else None
        )
        if len(times_s) >= max_repeats or sum(times_s) >= repeat_budget_s:
            break
    known = [p for p in peaks_bytes if p is not None]
    return {
        "status": "ok",
        "time_s": min(times_s),
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


# ---------------------------------------------------------------------------------- parent process side


def _descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (through ``/proc/<pid>/task/*/children``)."""
    found, stack = [], [pid]
    while stack:
        parent = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as handle:
                    children = [int(c) for c in handle.read().split()]
            except OSError:
                continue
            found += children
            stack += children
    return found


def _pss_bytes(pids: list[int]) -> int:
    """Total proportional set size of ``pids``: shared pages are split, so the sum counts them once."""
    total_kb = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as handle:
                total_kb += next((int(x.split()[1]) for x in handle if x.startswith("Pss:")), 0)
        except OSError:
            continue
    return 1024 * total_kb


class _Runner:
    """A persistent child process that runs one method; killed with its whole process group on timeout."""

    def __init__(self, method: str, torch_threads: int) -> None:
        self.torch_threads = torch_threads
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
        env = dict(os.environ, PYTHONPATH=path, MALLOC_MMAP_THRESHOLD_="131072")
        command = [sys.executable, "-c", "from lightning_ckpt.bench import _serve_stdio; _serve_stdio()"]
        self.method = method
        self.log = tempfile.TemporaryFile()  # the child's stderr (solver chatter); its tail shows on a crash
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            start_new_session=True,
        )

    def call(self, instance: KnapsackInstance, kill_after_s: float, repeat_budget_s: float = 0.0) -> dict:
        """Run the method on ``instance``; a result dict (see ``_timed_calls``) with ``peak_bytes``."""
        request = {
            "method": self.method,
            "weights": instance.weights.tolist(),
            "values": instance.values.tolist(),
            "capacity": instance.capacity,
            "repeat_budget_s": repeat_budget_s,
            "max_repeats": MAX_REPEATS if repeat_budget_s > 0 else 1,
            "torch_threads": self.torch_threads,
        }
        pid = self.process.pid
        baseline_bytes = _pss_bytes([pid, *_descendants(pid)])
        tree_peak_bytes = baseline_bytes
        pickle.dump(request, self.process.stdin)
        self.process.stdin.flush()
        start = time.perf_counter()
        while not select.select([self.process.stdout], [], [], _sample_interval_s(start))[0]:
            if time.perf_counter() - start > kill_after_s:
                self.kill()
                return {"status": "timeout", "note": f"timeout: killed after {kill_after_s:.0f} s"}
            children = _descendants(pid)
            if children:
                tree_peak_bytes = max(tree_peak_bytes, _pss_bytes([pid, *children]))
        try:
            result = pickle.load(self.process.stdout)
        except EOFError:
            code = self.process.wait()
            return {"status": "error", "note": f"error: runner died (exit {code}): {self._log_tail()}"}
        if result.get("self_peak_bytes") is not None:
            result["peak_bytes"] = max(result["self_peak_bytes"], tree_peak_bytes - baseline_bytes)
        return result

    def _log_tail(self) -> str:
        self.log.seek(0, os.SEEK_END)
        self.log.seek(max(0, self.log.tell() - 300))
        return (
            " ".join(self.log.read().decode(errors="replace").split()[-30:]) or "no message; out of memory?"
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """Kill the runner and every process it started (they share its process group)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except OSError:
            pass
        self.process.wait()

    def close(self, wait: bool = True) -> None:
        """Ask the runner to exit (end of its input); with ``wait``, kill it if it has not within 10 s."""
        try:
            self.process.stdin.close()
        except OSError:  # the runner is gone already (killed, or it crashed)
            pass
        if wait:
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
            self.log.close()


def _sample_interval_s(start: float) -> float:
    """Memory sampling period: fine at first (short peaks), coarser later (less CPU taken from the run)."""
    elapsed_s = time.perf_counter() - start
    return 0.005 if elapsed_s < 0.2 else 0.02 if elapsed_s < 5.0 else 0.1


# ------------------------------------------------------------------------------------------ the harness


@dataclass(frozen=True)
class BenchOptions:
    """How the benchmark runs.

    Attributes:
        max_seconds: skip a run whose estimated time exceeds this (a running one is killed at
            ``max(3 x, 10 s)``).
        max_memory_gb: refuse full-table methods whose table exceeds this (None: a quarter of the
            memory available at start).
        torch_threads: torch's intra-op threads in its runner (0: torch's default).
        progress: show a tqdm bar on stderr (only on a terminal).
        repeat_budget_s: repeat a call (best of up to 5) while the calls so far took less than this.
    """

    max_seconds: float = 3.0
    max_memory_gb: float | None = None
    torch_threads: int = 1
    progress: bool = True
    repeat_budget_s: float = 0.25


@dataclass
class BenchReport:
    """Rows of a run, plus each method's first call in a fresh process (imports and JIT included)."""

    rows: list[BenchRow]
    options: BenchOptions
    max_memory_bytes: int
    first_call_s: dict[str, float] = field(default_factory=dict)
    load_before: str = ""
    load_after: str = ""


class _Bench:
    """Runs methods on instances with the skip rules; keeps one runner per method and each one's rates."""

    def __init__(self, options: BenchOptions, max_memory_bytes: int) -> None:
        self.options = options
        self.max_seconds = options.max_seconds
        self.max_memory_bytes = max_memory_bytes
        self.kill_after_s = max(3.0 * options.max_seconds, 10.0)
        self.runners: dict[str, _Runner] = {}
        self.first_call_s: dict[str, float] = {}
        self.costliest: dict[tuple[str, str], tuple[int, float]] = {}  # (method, family) -> (cost, s)
        self.timed_out: dict[tuple[str, str], int] = {}  # (method, family) -> smallest cost that timed out

    def run_instance(self, instance: KnapsackInstance, methods: Sequence[str]) -> list[BenchRow]:
        rows = [self._run_method(instance, method) for method in methods]
        _score(rows, instance)
        return rows

    def estimate_s(self, instance: KnapsackInstance, method: str) -> float:
        """Seconds ``method`` should take, scaled from its costliest run on the family (or any family)."""
        cost = _cost(instance, method)
        measured = self.costliest.get((method, instance.family))
        if measured is None:
            same_method = [v for (m, _), v in self.costliest.items() if m == method]
            measured = max(same_method, default=None)
        if measured is None:
            return cost * METHODS[method].prior_seconds_per_cost
        return measured[1] * cost / max(measured[0], 1)

    def _run_method(self, instance: KnapsackInstance, method: str) -> BenchRow:
        row = BenchRow(instance.family, instance.n, instance.capacity, method, status="ok")
        if self._skip(row, instance, method):
            return row
        result = self._runner(method).call(instance, self.kill_after_s, self.options.repeat_budget_s)
        row.status, row.note = result["status"], result.get("note", "")
        key = (method, instance.family)
        if row.status == "timeout":
            self.timed_out[key] = min(self.timed_out.get(key, math.inf), _cost(instance, method))
        if row.status != "ok":
            return row
        row.time_s, row.repeats, row.peak_bytes = (
            result["time_s"],
            result["repeats"],
            result.get("peak_bytes"),
        )
        _check_solution(row, instance, result["chosen"])
        if _cost(instance, method) >= self.costliest.get(key, (0, 0.0))[0]:
            self.costliest[key] = (_cost(instance, method), row.time_s)
        return row

    def _skip(self, row: BenchRow, instance: KnapsackInstance, method: str) -> bool:
        """Fill ``row`` and return True when ``method`` cannot or should not run on ``instance``."""
        missing = _missing_dependency(method)
        table_bytes = METHODS[method].table_bytes_per_cell * (instance.n + 1) * (instance.capacity + 1)
        estimate_s = self.estimate_s(instance, method)
        if missing:
            row.status, row.note = "n/a", missing
        elif table_bytes > self.max_memory_bytes:
            row.status = "refused"
            row.note = f"refused: table needs {_gigabytes(table_bytes)} > {_gigabytes(self.max_memory_bytes)}"
        elif _cost(instance, method) >= self.timed_out.get((method, instance.family), math.inf):
            row.status, row.note = "skipped", "skipped (a smaller instance timed out)"
        elif estimate_s > self.max_seconds:
            row.status, row.estimated_time_s = "skipped", estimate_s
            row.note = f"skipped (est. {estimate_s:.0f} s)"
        return row.status != "ok"

    def _runner(self, method: str) -> _Runner:
        """The method's live runner, started and warmed up on a tiny instance if needed."""
        runner = self.runners.get(method)
        if runner is None or not runner.alive():
            runner = self.runners[method] = _Runner(method, self.options.torch_threads)
            start = time.perf_counter()
            runner.call(make_instance("A", 20, 1000), self.kill_after_s)
            self.first_call_s.setdefault(method, time.perf_counter() - start)
            if method in _WARM_UP_LARGE:  # start its worker processes too: a one-time cost, like the JIT
                runner.call(make_instance("A", *_WARM_UP_LARGE[method]), self.kill_after_s)
        return runner

    def close(self) -> None:
        for runner in self.runners.values():  # all at once: their interpreters shut down in parallel
            runner.close(wait=False)
        for runner in self.runners.values():
            runner.close()


def _cost(instance: KnapsackInstance, method: str) -> int:
    """Work units of ``method``: ``n * W`` cells for dense methods, ``n`` items for the others."""
    return instance.cells if METHODS[method].dense else instance.n


def _gigabytes(size_bytes: float) -> str:
    return f"{size_bytes / 1e9:.3g} GB"


_DEPENDENCY_CACHE: dict[tuple[str, ...], str] = {}


def _missing_dependency(method: str) -> str:
    """Why ``method`` cannot run here (``"n/a (...)"``), or ``""`` when it can."""
    needs = METHODS[method].needs
    if needs not in _DEPENDENCY_CACHE:
        absent = [m for m in needs if not _importable(m)]
        _DEPENDENCY_CACHE[needs] = f"n/a ({' and '.join(absent)} not installed)" if absent else ""
    return _DEPENDENCY_CACHE[needs]


def _importable(module: str) -> bool:
    if module == "lightning_ckpt.solver":  # ours must also expose the API, not just exist
        try:
            return hasattr(importlib.import_module(module), "solve_knapsack")
        except ImportError:
            return False
    return importlib.util.find_spec(module) is not None


def _check_solution(row: BenchRow, instance: KnapsackInstance, chosen: list[int]) -> None:
    """Recompute weight (integers), value (float64) and feasibility from the returned indices."""
    valid = len(set(chosen)) == len(chosen) and all(0 <= i < instance.n for i in chosen)
    if not valid:
        row.feasible, row.note = False, "invalid indices returned"
        return
    row.weight = sum(int(instance.weights[i]) for i in chosen)
    row.value = math.fsum(float(instance.values[i]) for i in chosen)
    row.feasible = row.weight <= instance.capacity


def _score(rows: list[BenchRow], instance: KnapsackInstance) -> None:
    """Fill gaps (vs the best feasible exact value), speed-ups vs torch's sliding Hirschberg, Gcell/s."""
    exact = [r.value for r in rows if r.status == "ok" and r.feasible and METHODS[r.method].exact]
    best = max(exact, default=None)
    torch_row = next((r for r in rows if r.method == TORCH_REFERENCE), None)
    torch_s, is_estimate = None, False
    if torch_row is not None and torch_row.status == "ok":
        torch_s = torch_row.time_s
    elif torch_row is not None and torch_row.status == "skipped" and torch_row.estimated_time_s:
        torch_s, is_estimate = torch_row.estimated_time_s, True
    for row in rows:
        if row.status != "ok" or row.value is None:
            continue
        if best is not None:
            row.gap = (best - row.value) / best if best > 0 else 0.0
        if torch_s is not None and row.time_s:
            row.speedup_vs_torch, row.speedup_is_estimate = torch_s / row.time_s, is_estimate
        if METHODS[row.method].dense and row.time_s:
            row.gcells_per_s = instance.cells / row.time_s / 1e9


def run_grid(
    families: Sequence[str],
    ns: Sequence[int],
    capacities: Sequence[int],
    methods: Sequence[str],
    *,
    seed: int = 0,
    options: BenchOptions | None = None,
    paper: bool = False,
) -> BenchReport:
    """Run ``methods`` on every instance of the grid (smallest first, so time estimates are measured).

    Args:
        families: instance families, see ``lightning_ckpt.solver.instances``.
        ns: item counts.
        capacities: capacities ``W``.
        methods: names from ``METHODS``, shown in this order for each instance.
        seed: instance seed.
        options: skip rules, torch threads, progress bar (defaults: ``BenchOptions()``).
        paper: also run n=2000 at the paper's W (1.4e8 and 3.8e8) with the O(W) methods and greedy (the
            full-table ones show as refused; ilp, which can take many minutes on family B, is left out).

    Returns:
        The report; its rows are grouped by instance.
    """
    jobs = [(make_instance(f, n, w, seed), list(methods)) for f in families for n in ns for w in capacities]
    if paper:
        paper_methods = [m for m in methods if m != "ilp"]
        jobs += [(make_instance(f, 2000, w, seed), paper_methods) for f in families for w in PAPER_W]
    return run_jobs(sorted(jobs, key=lambda job: (job[0].cells, job[0].family)), options or BenchOptions())


def run_jobs(jobs: Sequence[tuple[KnapsackInstance, Sequence[str]]], options: BenchOptions) -> BenchReport:
    """Run each job's methods on its instance, in order, with one warm runner process per method."""
    from tqdm import tqdm

    memory_bytes = int(options.max_memory_gb * 1e9) if options.max_memory_gb else _available_bytes() // 4
    bench = _Bench(options, memory_bytes)
    load_before = _load_average()
    rows: list[BenchRow] = []
    total = sum(len(m) for _, m in jobs)
    bar = tqdm(total=total, file=sys.stderr, disable=None if options.progress else True)
    try:
        for instance, methods in jobs:
            bar.set_description(f"{instance.family} n={instance.n} W={_short(instance.capacity)}")
            rows += bench.run_instance(instance, methods)
            bar.update(len(methods))
    finally:
        bar.close()
        bench.close()
    return BenchReport(rows, options, memory_bytes, dict(bench.first_call_s), load_before, _load_average())


def _load_average() -> str:
    """The 1-minute load average: other work on the machine slows every method (and workers most)."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "unknown"


def _available_bytes() -> int:
    """``MemAvailable`` from ``/proc/meminfo`` (8 GB where unknown)."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return 1024 * int(line.split()[1])
    except OSError:
        pass
    return 8 * 10**9


# ------------------------------------------------------------------------------------------- reporting

_COLUMNS = (
    "family",
    "n",
    "W",
    "method",
    "time_s",
    "peak_MB",
    "value",
    "feasible",
    "gap",
    "vs_torch",
    "Gcell/s",
)


def _short(number: int) -> str:
    """``4000000`` -> ``"4e6"``, ``140000000`` -> ``"1.4e8"``, ``300`` -> ``"300"``.

    Example:
        >>> _short(4_000_000), _short(140_000_000), _short(300), _short(123_456)
        ('4e6', '1.4e8', '300', '123456')
    """
    if number < 1000:
        return str(number)
    exponent = int(math.floor(math.log10(number)))
    mantissa = number / 10**exponent
    text = f"{mantissa:g}e{exponent}"
    return text if len(text) <= 6 and float(text) == number else str(number)


def _cells(row: BenchRow) -> list[str]:
    ok = row.status == "ok"
    over = (row.weight or 0) - row.capacity
    feasible = (
        "-" if row.feasible is None else "yes" if row.feasible else f"NO (+{over})" if over > 0 else "NO"
    )
    speedup = "-"
    if row.speedup_vs_torch is not None:
        speedup = ("~" if row.speedup_is_estimate else "") + f"{row.speedup_vs_torch:.3g}x"
    return [
        row.family,
        str(row.n),
        _short(row.capacity),
        row.method,
        f"{row.time_s:.3g}" if ok else "-",
        f"{row.peak_bytes / BYTES_PER_MB:.1f}" if ok and row.peak_bytes is not None else "-",
        f"{row.value:.10g}" if row.value is not None else "-",
        feasible,
        "-" if row.gap is None else "0" if row.gap == 0 else f"{row.gap:.1e}",
        speedup,
        f"{row.gcells_per_s:.2f}" if row.gcells_per_s is not None else "-",
    ]


def format_table(rows: Sequence[BenchRow]) -> str:
    """Aligned text table, one line per row, a blank line between instances, notes at the end of lines.

    Example:
        >>> print(format_table([BenchRow("A", 3, 10, "greedy", "n/a", note="n/a (solver)")]))
        family  n  W   method  time_s  peak_MB  value  feasible  gap  vs_torch  Gcell/s
        A       3  10  greedy  -       -        -      -         -    -         -        n/a (solver)
    """
    table = [list(_COLUMNS)] + [_cells(row) for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(_COLUMNS))]
    lines, previous = [], None
    for cells, row in zip(table, [None, *rows], strict=True):
        instance = None if row is None else (row.family, row.n, row.capacity)
        if previous is not None and instance != previous:
            lines.append("")
        previous = instance
        note = f"  {row.note}" if row is not None and row.note else ""
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip() + note)
    return "\n".join(lines)


def _machine() -> dict:
    """What the figures were measured on."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for package in ("numpy", "numba", "torch", "scipy"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = "absent"
    return {
        "platform": platform.platform(),
        "processor": _cpu_model(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        **versions,
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            return next((x.split(":", 1)[1].strip() for x in handle if x.startswith("model name")), "")
    except OSError:
        return platform.processor()


def _header(report: BenchReport) -> str:
    machine = _machine()
    threads = report.options.torch_threads or "torch's default"
    return (
        f"# {machine['processor'] or 'unknown CPU'}, {machine['cpus']} CPUs; python {machine['python']}, "
        f"numpy {machine['numpy']}, numba {machine['numba']}, torch {machine['torch']}\n"
        f"# time: best of up to {MAX_REPEATS} calls within {report.options.repeat_budget_s:g} s, warm process; "
        "peak_MB: "
        "resident growth during the call (process tree); gap vs the best feasible exact value; vs_torch: "
        f"{TORCH_REFERENCE} time / this time (~: torch time estimated); Gcell/s = n*W / time\n"
        f"# skip rule: estimated time > {report.options.max_seconds:g} s; full tables > "
        f"{_gigabytes(report.max_memory_bytes)} refused; torch-* with {threads} intra-op thread(s); "
        f"load average before/after: {report.load_before} / {report.load_after}"
    )


def _footer(report: BenchReport) -> str:
    firsts = ", ".join(f"{m} {s:.2f} s" for m, s in report.first_call_s.items())
    return f"# first call in a fresh process (imports and JIT included, n=20): {firsts}" if firsts else ""


def write_plot(rows: Sequence[BenchRow], path: str) -> None:
    """Log-log plot of time against ``n * W``: a colour per method, a line style per family."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    figure = Figure(figsize=(8, 5.5))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    styles = dict(zip(FAMILIES, ("-", "--", ":"), strict=True))
    methods = [
        m for m in dict.fromkeys(r.method for r in rows) if any(r.method == m and r.time_s for r in rows)
    ]
    colors = {m: f"C{i}" for i, m in enumerate(methods)}
    for method in methods:
        for family, style in styles.items():
            ok = [r for r in rows if (r.method, r.family, r.status) == (method, family, "ok")]
            points = sorted((r.n * r.capacity, r.time_s) for r in ok)
            if points:
                axes.plot(*zip(*points, strict=True), style, marker="o", markersize=3, color=colors[method])
    handles = [Line2D([], [], color=colors[m], marker="o", label=m) for m in methods]
    handles += [Line2D([], [], color="grey", linestyle=s, label=f"family {f}") for f, s in styles.items()]
    axes.set(xscale="log", yscale="log", xlabel="cells n*W", ylabel="time (s)")
    axes.set_title("0/1 knapsack solvers: time vs n*W (skipped runs not drawn)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(handles=handles, fontsize=7, ncol=2)
    figure.savefig(path, dpi=120, bbox_inches="tight")


def write_json(report: BenchReport, path: str, arguments: dict, targets: Sequence[dict] = ()) -> None:
    """All rows, the machine, the arguments and any target verdicts as JSON."""
    payload = {
        "machine": _machine(),
        "arguments": arguments,
        "options": asdict(report.options),
        "max_memory_bytes": report.max_memory_bytes,
        "first_call_s": report.first_call_s,
        "rows": [asdict(row) for row in report.rows],
        "targets": list(targets),
    }
    with open(path, "w") as handle:
        json.dump(payload, handle, indent=1)


# --------------------------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class Target:
    """One figure an issue asks for; every target also requires a feasible, exact answer."""

    issue: str
    family: str
    n: int
    capacity: int
    method: str
    reference: str | None = None  # ratio target: reference time / method time >= min_ratio
    min_ratio: float = 1.0
    max_time_s: float | None = None
    max_peak_bytes_per_unit: float | None = None
    min_gcells_per_s: float | None = None

    @property
    def label(self) -> str:
        """``"issue 3: A n=1000 W=4e6 auto >= 20x torch-sliding"`` and the like."""
        needs = [f">= {self.min_ratio:g}x {self.reference}"] if self.reference else []
        if self.max_time_s is not None:
            needs.append(
                f"< {self.max_time_s * 1e3:g} ms" if self.max_time_s < 1 else f"< {self.max_time_s:g} s"
            )
        if self.max_peak_bytes_per_unit is not None:
            needs.append(f"peak <= {self.max_peak_bytes_per_unit:g} B/unit")
        if self.min_gcells_per_s is not None:
            needs.append(f">= {self.min_gcells_per_s:g} Gcell/s")
        instance = f"{self.family} n={self.n} W={_short(self.capacity)}"
        return f"{self.issue}: {instance} {self.method} {', '.join(needs)}"


def _targets(paper: bool) -> list[Target]:
    """Issue 3's targets and issue 2's floor; the paper-scale ones only with ``paper``."""
    targets = [
        Target("issue 3", "A", 1000, 4 * 10**6, "auto", TORCH_REFERENCE, 20.0),
        Target("issue 3", "B", 500, 2 * 10**6, "hirschberg-w2", TORCH_REFERENCE, 3.0),
    ]
    for family in FAMILIES:  # real-use size, PyTorch's own quantization
        targets.append(Target("issue 3", family, 300, 10**4, "auto", max_time_s=0.005))
        targets.append(Target("issue 3", family, 300, 10**4, "auto", "torch-dp"))
    targets += [Target("issue 2 floor", f, 1000, 4 * 10**6, "hirschberg", TORCH_REFERENCE) for f in FAMILIES]
    if paper:
        w = PAPER_W[0]
        targets.append(Target("issue 3", "A", 2000, w, "auto", max_time_s=30.0, max_peak_bytes_per_unit=32.0))
        targets.append(Target("issue 3", "B", 2000, w, "hirschberg-w2", min_gcells_per_s=3.0))
    return targets


def _target_jobs(targets: Sequence[Target], seed: int) -> list[tuple[KnapsackInstance, list[str]]]:
    """Each target instance once, with the methods its targets need plus exact cross-checks."""
    wanted: dict[tuple[str, int, int], set[str]] = {}
    for t in targets:
        methods = wanted.setdefault((t.family, t.n, t.capacity), set())
        methods |= {t.method, t.reference} - {None}
        if t.capacity not in PAPER_W:
            methods.add("hirschberg")
        if t.family == "A":
            methods.add("ilp")  # an independent optimum (HiGHS), fast on family A
    instances = [(make_instance(f, n, w, seed), ms) for (f, n, w), ms in wanted.items()]
    return sorted(((i, [m for m in METHODS if m in ms]) for i, ms in instances), key=lambda job: job[0].cells)


def _verdict(target: Target, rows: Sequence[BenchRow]) -> dict:
    """PASS or MISS for ``target``, with the measured figures and the reasons for a miss."""
    found = {
        r.method: r for r in rows if (r.family, r.n, r.capacity) == (target.family, target.n, target.capacity)
    }
    row, reference = found.get(target.method), found.get(target.reference or "")
    if row is None or row.status != "ok":
        misses = [f"{target.method} did not run ({row.note if row else 'absent'})"]
        return {"target": target.label, "passed": False, "measured": "", "misses": misses}
    misses = [] if row.feasible else ["infeasible"]
    if row.gap is None or row.gap > 1e-9:
        misses.append(f"not exact (gap {row.gap})")
    measured = [f"{target.method} {row.time_s:.4g} s"]
    others = [r for m, r in found.items() if m != target.method and r.status == "ok" and METHODS[m].exact]
    if not any(r.feasible for r in others):
        measured.append("optimum not cross-checked (no other exact method ran)")
    if target.reference and (reference is None or reference.status != "ok"):
        misses.append(f"{target.reference} did not run")
    elif target.reference:
        ratio = reference.time_s / row.time_s
        measured.append(f"{target.reference} {reference.time_s:.4g} s, ratio {ratio:.3g}x")
        if ratio < target.min_ratio:
            misses.append(f"ratio {ratio:.3g}x < {target.min_ratio:g}x")
    if target.max_time_s is not None and row.time_s >= target.max_time_s:
        misses.append(f"time {row.time_s:.4g} s >= {target.max_time_s:g} s")
    if target.max_peak_bytes_per_unit is not None:
        per_unit = (row.peak_bytes or 0) / target.capacity
        measured.append(f"peak {per_unit:.3g} B/unit")
        if row.peak_bytes is None or per_unit > target.max_peak_bytes_per_unit:
            misses.append(f"peak {per_unit:.3g} B/unit > {target.max_peak_bytes_per_unit:g}")
    if target.min_gcells_per_s is not None:
        measured.append(f"{row.gcells_per_s:.3g} Gcell/s")
        if row.gcells_per_s < target.min_gcells_per_s:
            misses.append(f"{row.gcells_per_s:.3g} Gcell/s < {target.min_gcells_per_s:g}")
    return {"target": target.label, "passed": not misses, "measured": ", ".join(measured), "misses": misses}


def _format_verdicts(verdicts: Sequence[dict]) -> str:
    lines = []
    for v in verdicts:
        reason = f"  [{'; '.join(v['misses'])}]" if v["misses"] else ""
        lines.append(f"{'PASS' if v['passed'] else 'MISS'}  {v['target']}: {v['measured']}{reason}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-ckpt bench",
        description="Benchmark the knapsack solvers against PyTorch's, side by side on the same instances.",
    )
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), help="instance families (A B C)")
    parser.add_argument("--n", nargs="+", type=_positive_int, default=list(DEFAULT_N), help="item counts")
    parser.add_argument(
        "--W", nargs="+", type=_positive_int, default=list(DEFAULT_W), help="capacities (1e6 ok)"
    )
    parser.add_argument("--methods", nargs="+", default=list(METHODS), help=f"among {' '.join(METHODS)}")
    parser.add_argument("--seed", type=int, default=0, help="instance seed (default 0)")
    parser.add_argument("--paper", action="store_true", help="add n=2000 at W=1.4e8 and 3.8e8, O(W) methods")
    parser.add_argument("--targets", action="store_true", help="run the issue targets, print PASS/MISS")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="skip runs estimated longer than this (3; 120 with --paper; 600 with --targets)",
    )
    parser.add_argument(
        "--max-memory-gb",
        type=float,
        default=None,
        help="refuse full DP tables above this (default: 1/4 of the available memory)",
    )
    parser.add_argument("--plot", default=None, help="write a time-vs-n*W plot (png)")
    parser.add_argument("--json", default=None, help="write every row as JSON")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads (1; 0: default)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def _positive_int(text: str) -> int:
    """``"1e6"`` -> 1000000, for ``--n`` and ``--W``."""
    number = float(text)
    if not number.is_integer() or number < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (1e6 allowed), got {text!r}")
    return int(number)


def _check_names(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    args.families = [f for item in args.families for f in item.split(",") if f]
    args.methods = [m for item in args.methods for m in item.split(",") if m]
    for flag, names, allowed in (
        ("--families", args.families, FAMILIES),
        ("--methods", args.methods, METHODS),
    ):
        unknown = [name for name in names if name not in allowed]
        if unknown:
            parser.error(f"{flag} must be among {', '.join(allowed)}, got {', '.join(unknown)}")


def main(argv: list[str] | None = None) -> int:
    """``lightning-ckpt bench``: print the table (and the target verdicts) on stdout.

    Args:
        argv: the command's arguments (``--help`` lists them).

    Returns:
        0; 1 if a ``--targets`` target was missed; 2 for bad arguments.
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        _check_names(parser, args)
    except SystemExit as exit_request:
        return int(exit_request.code or 0)
    default_seconds = 600.0 if args.targets else 120.0 if args.paper else 3.0
    options = BenchOptions(
        max_seconds=args.max_seconds or default_seconds,
        max_memory_gb=args.max_memory_gb,
        torch_threads=args.torch_threads,
        progress=not args.no_progress,
        repeat_budget_s=3.0 if args.targets else 0.25,  # targets: best of several calls, also for long ones
    )
    targets = _targets(args.paper) if args.targets else []
    if targets:
        report = run_jobs(_target_jobs(targets, args.seed), options)
    else:
        grid = (args.families, args.n, args.W, args.methods)
        report = run_grid(*grid, seed=args.seed, options=options, paper=args.paper)
    verdicts = [_verdict(t, report.rows) for t in targets]
    sys.stdout.write("\n".join([_header(report), "", format_table(report.rows), "", _footer(report)]) + "\n")
    if verdicts:
        sys.stdout.write("\n" + _format_verdicts(verdicts) + "\n")
    if args.plot:
        write_plot(report.rows, args.plot)
    if args.json:
        write_json(report, args.json, vars(args), verdicts)
    return 0 if all(v["passed"] for v in verdicts) else 1
