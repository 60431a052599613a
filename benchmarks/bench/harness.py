"""The harness: run methods on instances with the skip rules, check and score the answers.

One warm runner per method (:mod:`benchmarks.bench.runner`); a run is skipped when its estimated time
(scaled from the method's costliest run so far) is over ``max_seconds``, refused when its full table does
not fit in ``max_memory_gb``, and marked n/a when its dependencies are not installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from benchmarks.bench.instances import PAPER_W, BenchRow, KnapsackInstance, _short, make_instance
from benchmarks.bench.methods import METHODS, TORCH_REFERENCE
from benchmarks.bench.runner import _Runner

# n, W: above SolverOptions().parallel_min_solve_cells, so that the warm-up starts the solver's workers
_WARM_UP_LARGE = {"hirschberg-w2": (600, 1_000_000)}


@dataclass(frozen=True)
class BenchOptions:
    """How the benchmark runs.

    Attributes:
        max_seconds: skip a run whose estimated time exceeds this (a running one is killed at
            ``timeout_s``).
        timeout_s: kill a call running longer than this, reported as a timeout (None:
            ``max(3 * max_seconds, 10 s)``).
        max_memory_gb: refuse full-table methods whose table exceeds this (None: a quarter of the
            memory available at start).
        torch_threads: torch's intra-op threads in its runner (0: torch's default).
        progress: show a tqdm bar on stderr (only on a terminal).
        repeat_budget_s: repeat a call (best of up to 5) while the calls so far took less than this.
    """

    max_seconds: float = 3.0
    timeout_s: float | None = None
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
        self.kill_after_s = options.timeout_s or max(3.0 * options.max_seconds, 10.0)
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
        row.time_s, row.cpu_s, row.repeats, row.peak_bytes = (
            result["time_s"],
            result.get("cpu_s"),
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
        families: instance families, see ``benchmarks.bench.generators``.
        ns: item counts.
        capacities: capacities ``W``.
        methods: names from ``METHODS``, shown in this order for each instance.
        seed: instance seed.
        options: skip rules, torch threads, progress bar (defaults: ``BenchOptions()``).
        paper: also run n=2000 at the paper's W (1.4e8 and 3.8e8) with every method (the full-table
            ones show as refused; ilp, HiGHS with zero gap, stops at its 60 s limit on families B and C).

    Returns:
        The report; its rows are grouped by instance.
    """
    jobs = [(make_instance(f, n, w, seed), list(methods)) for f in families for n in ns for w in capacities]
    if paper:
        jobs += [(make_instance(f, 2000, w, seed), list(methods)) for f in families for w in PAPER_W]
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
