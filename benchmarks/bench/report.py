"""The benchmark's output: the aligned table with its header and footer, the plot, the JSON."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Sequence
from dataclasses import asdict

from benchmarks.bench.harness import BenchReport, _gigabytes
from benchmarks.bench.instances import KNOWN_FAMILIES, BenchRow, _short
from benchmarks.bench.methods import TORCH_REFERENCE
from benchmarks.bench.runner import MAX_REPEATS

BYTES_PER_MB = 1e6

_COLUMNS = (
    "family",
    "n",
    "W",
    "method",
    "time_s",
    "cpu_s",
    "peak_MB",
    "value",
    "feasible",
    "gap",
    "vs_torch",
    "Gcell/s",
)


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
        f"{row.cpu_s:.3g}" if ok and row.cpu_s is not None else "-",
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
        family  n  W   method  time_s  cpu_s  peak_MB  value  feasible  gap  vs_torch  Gcell/s
        A       3  10  greedy  -       -      -        -      -         -    -         -        n/a (solver)
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
        f"# time: best of up to {MAX_REPEATS} calls within {report.options.repeat_budget_s:g} s, "
        "warm process; cpu_s: the runner's CPU time in that call (its threads, not its worker processes; under load "
        "time_s grows, cpu_s much less); peak_MB: "
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
    styles = dict(zip(KNOWN_FAMILIES, ("-", "--", ":", "-.", (0, (1, 4))), strict=True))
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
