"""``--targets``: the speed and memory targets the solver is held to, the jobs that measure them, and PASS
or MISS for each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.bench.instances import (
    FAMILIES,
    PAPER_W,
    BenchRow,
    KnapsackInstance,
    _short,
    make_instance,
)
from benchmarks.bench.methods import METHODS, TORCH_REFERENCE


@dataclass(frozen=True)
class Target:
    """One figure the solver is held to; every target also requires a feasible, exact answer."""

    group: str
    """What the target is for: ``"speed"`` (against PyTorch or a time), ``"floor"`` (never slower than
    PyTorch), ``"paper scale"``."""
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
        """``"speed: A n=1000 W=4e6 auto >= 20x torch-sliding"`` and the like."""
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
        return f"{self.group}: {instance} {self.method} {', '.join(needs)}"


def _targets(paper: bool) -> list[Target]:
    """The speed targets and the floor; the paper-scale ones only with ``paper``."""
    targets = [
        Target("speed", "A", 1000, 4 * 10**6, "auto", TORCH_REFERENCE, 20.0),
        Target("speed", "B", 500, 2 * 10**6, "hirschberg-w2", TORCH_REFERENCE, 3.0),
    ]
    for family in FAMILIES:  # real-use size, PyTorch's own quantization
        targets.append(Target("speed", family, 300, 10**4, "auto", max_time_s=0.005))
        targets.append(Target("speed", family, 300, 10**4, "auto", "torch-dp"))
    targets += [Target("floor", f, 1000, 4 * 10**6, "hirschberg", TORCH_REFERENCE) for f in FAMILIES]
    if paper:
        w = PAPER_W[0]
        targets.append(
            Target("paper scale", "A", 2000, w, "auto", max_time_s=30.0, max_peak_bytes_per_unit=32.0)
        )
        targets.append(Target("paper scale", "B", 2000, w, "hirschberg-w2", min_gcells_per_s=3.0))
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
