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

from benchmarks.bench.cli import main
from benchmarks.bench.harness import BenchOptions, BenchReport, run_grid, run_jobs
from benchmarks.bench.instances import FAMILIES, KNOWN_FAMILIES, BenchRow, KnapsackInstance, make_instance
from benchmarks.bench.methods import METHODS
from benchmarks.bench.report import format_table, write_json, write_plot
from benchmarks.bench.targets import Target

__all__ = [
    "FAMILIES",
    "KNOWN_FAMILIES",
    "METHODS",
    "BenchOptions",
    "BenchReport",
    "BenchRow",
    "KnapsackInstance",
    "Target",
    "format_table",
    "main",
    "make_instance",
    "run_grid",
    "run_jobs",
    "write_json",
    "write_plot",
]
