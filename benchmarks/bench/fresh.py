"""``python -m benchmarks.bench.fresh``: the first solve in a fresh process, for plan-sized instances.

What a training job pays once: ``import lightning_ckpt.solver`` and its first ``solve_knapsack``. For
each instance (GPT-like: identical blocks at GPT-2 XL's sizes; family P: heterogeneous layers and a
large head, ``benchmarks.bench.prefix``; plan: the planner's own instance from a profiled stack of
blocks of mixed widths at three budgets, ``benchmarks.bench.plan_instance``), several fresh processes
solve it with prefix capacities and, side by side, the additive solve of the same items (the plan
before); it prints the median of each, their ratio, and whether numba was imported. Instances are
made in this process and handed over in a file, outside the timed call.

Example::

    python -m benchmarks.bench.fresh --n 8 48 200 --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

_CODE = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np
from lightning_ckpt.solver import solve_knapsack
t1 = time.perf_counter()
arrays = np.load({path!r})
w, v, cap, take, skip = (arrays[k] for k in ("w", "v", "cap", "take", "skip"))
cap = int(cap)
t2 = time.perf_counter()
if {additive}:
    solve_knapsack(w, v, int(min(cap, take.min(), skip.min())))
else:
    solve_knapsack(w, v, cap, prefix_capacities=take, skip_capacities=skip)
t3 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "solve_s": t3 - t2, "numba": "numba" in sys.modules}}))
"""


KINDS = ("GPT", "P", "plan@0.2", "plan@0.5", "plan@0.8")


def instance(kind: str, n: int):
    """``(weights, values, W, take caps, skip caps)``: at W = 1.4e8 quanta (GPT-2 XL at 512-byte quanta),
    or a profiled plan's (``plan@<budget fraction>``)."""
    import numpy as np

    from benchmarks.bench.prefix import make_prefix_instance

    if kind.startswith("plan@"):
        from benchmarks.bench.plan_instance import plan_instance

        return plan_instance(n, budget_fraction=float(kind.split("@")[1]))
    capacity = 140_000_000
    if kind == "P":
        p = make_prefix_instance(n, capacity, seed=0)
        return p.weights, p.values, capacity, p.take, p.skip
    weights = np.full(n, min(3_078_912, capacity // (n // 2 + 1)), dtype=np.int64)  # identical blocks
    values = np.random.default_rng(0).uniform(0.5, 1.5, n)
    take = np.full(n, capacity - 2 * weights[0])  # its own activations and the backward's temporaries
    return weights, values, capacity, take, take - weights[0] // 2  # checkpointed: the recompute too


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""This checkout's root (what ``python -m benchmarks...`` imports ``lightning_ckpt`` from)."""


def child_line(code: str, tree: str = ROOT, *, env: dict[str, str] | None = None) -> str:
    """The last line ``python -c code`` prints in a fresh process that imports from ``tree`` first (run
    there), with ``env`` on top of this process's environment (a value of None unsets the variable)."""
    merged = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")])))
    for name, value in (env or {}).items():
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = value
    done = subprocess.run(
        [sys.executable, "-c", code], env=merged, cwd=tree, capture_output=True, text=True, check=True
    )
    return done.stdout.strip().splitlines()[-1]


def _run(path: str, additive: bool) -> dict:
    return json.loads(child_line(_CODE.format(path=path, additive=additive)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench.fresh", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--n", nargs="+", type=int, default=[8, 48, 200], help="item counts")
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per figure")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), help=f"among {' '.join(KINDS)}")
    args = parser.parse_args(argv)
    print("# median (min) over fresh processes; ratio of the medians")
    header = f"{'kind':<8} {'n':>4} {'prefix_ms':>16} {'additive_ms':>18} {'ratio':>7} {'import_ms':>10}"
    print(f"{header}  numba(prefix/additive)")
    for kind in args.kinds:
        for n in args.n:
            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "instance.npz")
                w, v, cap, take, skip = instance(kind, n)
                np.savez(path, w=w, v=v, cap=cap, take=take, skip=skip)
                runs = {flag: [_run(path, flag) for _ in range(args.runs)] for flag in (False, True)}
            solve = {flag: [r["solve_s"] * 1e3 for r in rs] for flag, rs in runs.items()}
            median = {flag: statistics.median(times) for flag, times in solve.items()}
            shown = {flag: f"{median[flag]:.2f} ({min(solve[flag]):.2f})" for flag in solve}
            imported = statistics.median(r["import_s"] for r in runs[False]) * 1e3
            numba = "/".join(str(any(r["numba"] for r in runs[flag])) for flag in (False, True))
            ratio = median[False] / median[True]
            print(
                f"{kind:<8} {n:>4} {shown[False]:>16} {shown[True]:>18} {ratio:>7.3f} {imported:>10.1f}  {numba}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
