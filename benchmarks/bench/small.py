"""``python -m benchmarks.bench.small``: warm solves of small instances, this tree against another.

What a caller that solves many small knapsacks pays per call: ``torch.compile``-like uncapped
instances (n = 42-54, W up to 5,000), callback-sized capped ones (GPT-like blocks n = 8 and 200,
family P n = 300 at W = 1.4e8) and uncapped n = 300, W = 1e4. Each tree (this one, and ``--base``,
a checkout of another commit) runs in its own child process, once with the numba kernels loaded
first and once with numba off (``LIGHTNING_CKPT_NO_NUMBA=1``: what a process pays before its
numpy work passes numba's load cost); rounds alternate the
trees, and the table shows the best time per call (best of the calls that fit in 0.2 s) over the
rounds, and the ratio base / this (above 1: this tree is faster); the last column sets this
tree's numpy time beside the base's numba time. Instances are made here and handed over in a file.
The base may be a tree from before 2026-11-30, which loads numba at import and has no prefix
capacities (``edbb8a9``: where the recorded ``torch.compile`` instances took the 0.06-0.15 ms
that issue 23 recalls); its capped instances show nan. ``--fresh N`` adds, per tree, the median
of N first calls, each in a new process (numba installed and not off: what a process pays before
the ski-rental rule loads it).

Example::

    git archive cccc139 | tar -x -C /tmp/base && python -m benchmarks.bench.small --base /tmp/base
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

from benchmarks.bench.fresh import child_line

_CODE = """
import inspect, json, sys, time
import numpy as np
from lightning_ckpt.solver import solve_knapsack
capped = "prefix_capacities" in inspect.signature(solve_knapsack).parameters
if {numba}:
    try:
        from lightning_ckpt.solver.runtime import backend
    except ImportError:  # a tree from before 2026-11-30 loads numba when imported
        pass
    else:
        backend.load_numba()
arrays = np.load({path!r})
best = {{}}
for name in {names!r}:
    w, v, cap = arrays[name + ".w"], arrays[name + ".v"], int(arrays[name + ".cap"])
    caps = {{}}
    if name + ".take" in arrays:
        caps = {{"prefix_capacities": arrays[name + ".take"], "skip_capacities": arrays[name + ".skip"]}}
    if caps and not capped:  # a tree without prefix capacities
        continue
    solve_knapsack(w, v, cap, **caps)
    times, spent = [], 0.0
    while spent < 0.2 or len(times) < 5:
        start = time.perf_counter()
        solve_knapsack(w, v, cap, **caps)
        times.append(time.perf_counter() - start)
        spent += times[-1]
    best[name] = min(times)
print(json.dumps(best))
"""


_FRESH_CODE = """
import inspect, time
import numpy as np
from lightning_ckpt.solver import solve_knapsack
arrays = np.load({path!r})
name = {name!r}
w, v, cap = arrays[name + ".w"], arrays[name + ".v"], int(arrays[name + ".cap"])
caps = {{}}
if name + ".take" in arrays:
    caps = {{"prefix_capacities": arrays[name + ".take"], "skip_capacities": arrays[name + ".skip"]}}
if caps and "prefix_capacities" not in inspect.signature(solve_knapsack).parameters:
    print(float("nan"))  # a tree without prefix capacities
else:
    start = time.perf_counter()
    solve_knapsack(w, v, cap, **caps)
    print(time.perf_counter() - start)
"""


def instances() -> dict[str, tuple]:
    """Name -> ``(weights, values, capacity[, take, skip])``."""
    from benchmarks.bench.fresh import instance
    from benchmarks.bench.generators import make_instance

    made: dict[str, tuple] = {}
    for family in "ABC":
        for n, capacity in ((42, 1000), (48, 5000), (54, 5000), (300, 10_000)):
            made[f"{family} n={n} W={capacity}"] = make_instance(family, n, capacity, seed=1)
    for kind, n in (("GPT", 8), ("GPT", 200), ("P", 300)):
        made[f"{kind} n={n} capped"] = instance(kind, n)
    return made


def _child(tree: str, path: str, names: list[str], numba: bool) -> dict[str, float]:
    # numpy throughout without numba: many small solves would load numba after about a second
    env = {"LIGHTNING_CKPT_NO_NUMBA": None if numba else "1"}
    return json.loads(child_line(_CODE.format(path=path, names=names, numba=numba), tree, env=env))


def _fresh(tree: str, path: str, name: str) -> float:
    """Seconds of the first ``solve_knapsack`` call in a new process (the import not counted)."""
    code = _FRESH_CODE.format(path=path, name=name)
    return float(child_line(code, tree, env={"LIGHTNING_CKPT_NO_NUMBA": None}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench.small", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--base", required=True, help="a checkout of the tree to compare with")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds (3)")
    parser.add_argument("--fresh", type=int, default=0, help="fresh processes per instance and tree (0)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.fresh < 0:
        parser.error(f"--rounds must be >= 1 and --fresh >= 0, got {args.rounds} and {args.fresh}")
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    made = instances()
    names = list(made)
    best: dict[tuple[str, bool], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "instances.npz")
        arrays = {
            f"{name}.{key}": a
            for name, i in made.items()
            for key, a in zip(("w", "v", "cap", "take", "skip"), i, strict=False)  # uncapped: 3
        }
        np.savez(path, **arrays)
        for _ in range(args.rounds):
            for tree in (here, os.path.abspath(args.base)):
                for numba in (False, True):
                    times = _child(tree, path, names, numba)
                    seen = best.setdefault((tree, numba), {})
                    for name, seconds in times.items():
                        seen[name] = min(seen.get(name, np.inf), seconds)
        fresh: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.fresh):
            for name in names:
                for tree in (here, os.path.abspath(args.base)):
                    fresh.setdefault((tree, name), []).append(_fresh(tree, path, name))
    print("# best ms per call over the rounds; ratio = base / this (above 1: this tree is faster)")
    fresh_head = f" {'fresh this':>10} {'base':>8} {'ratio':>6}" if args.fresh else ""
    print(
        f"{'instance':<22} {'numpy this':>10} {'base':>8} {'ratio':>6} {'numba this':>11} {'base':>8} {'ratio':>6}"
        + f" {'numba base / numpy this':>23}"
        + fresh_head
    )
    base = os.path.abspath(args.base)
    for name in names:
        cells = []
        for numba in (False, True):
            ours, theirs = (best[(tree, numba)].get(name, np.nan) * 1e3 for tree in (here, base))
            cells.append(f"{ours:>10.3f} {theirs:>8.3f} {theirs / ours:>6.2f}")
        cells.append(f"{best[(base, True)].get(name, np.nan) / best[(here, False)][name]:>24.2f}")
        if args.fresh:  # median ms of the first calls
            ours, theirs = (float(np.median(fresh[(tree, name)])) * 1e3 for tree in (here, base))
            cells.append(f" {ours:>10.3f} {theirs:>8.3f} {theirs / ours:>6.2f}")
        print(f"{name:<22} {cells[0]} {cells[1]:>26}" + "".join(cells[2:]))
    if args.fresh:
        print(f"# fresh: median ms of {args.fresh} first calls, each in a new process (numba not off)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
