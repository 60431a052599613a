"""``python -m benchmarks.bench.uncapped_fresh``: one uncapped solve per fresh process, on the families.

What the issue's table measured: ``import lightning_ckpt.solver`` done, then one ``solve_knapsack``
call (the numba kernels not loaded before it), its time and the resident memory it added (VmHWM
after less VmRSS before). ``auto-dense`` is ``"auto"`` with ``sparse_max_states=0``: the path
``"auto"`` took before the sparse states.

Example::

    python -m benchmarks.bench.uncapped_fresh --families U W C --n 2000 --W 140000000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks.bench.generators import KNOWN_FAMILIES

_CODE = """
import json, time
from benchmarks.bench.child import _reset_peak_rss, _status_kb
from benchmarks.bench.generators import make_instance
from lightning_ckpt.solver import SolverOptions, solve_knapsack
w, v, cap = make_instance({family!r}, {n}, {capacity}, seed={seed})
options = SolverOptions(sparse_max_states=0) if {dense} else None
_reset_peak_rss()
before = _status_kb("self", "VmRSS")
start = time.perf_counter()
result = solve_knapsack(w, v, cap, options=options)
seconds = time.perf_counter() - start
grown = _status_kb("self", "VmHWM") - before
print(json.dumps({{"s": seconds, "mib": grown / 1024, "value": result.value, "path": result.stats.path}}))
"""


def fresh_call(family: str, n: int, capacity: int, seed: int, dense: bool, timeout_s: float) -> dict:
    """One call in a new interpreter: ``{"s", "mib", "value", "path"}``, or ``{"timeout": ...}``."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    code = _CODE.format(family=family, n=n, capacity=capacity, seed=seed, dense=dense)
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"timeout": timeout_s}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench.uncapped_fresh", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--families", nargs="+", default=["U", "W", "B", "C"], help=f"among {' '.join(KNOWN_FAMILIES)}"
    )
    parser.add_argument("--n", type=int, default=2000, help="items")
    parser.add_argument("--W", type=int, default=140_000_000, help="capacity")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", nargs="+", default=["auto", "auto-dense"], help="auto auto-dense")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per call")
    args = parser.parse_args(argv)
    print(f"{'family':<7} {'method':<11} {'time':>10} {'peak_MiB':>9} {'path':<11} value")
    for family in args.families:
        for method in args.methods:
            row = fresh_call(family, args.n, args.W, args.seed, method == "auto-dense", args.timeout_s)
            if "timeout" in row:
                print(f"{family:<7} {method:<11} {'> ' + str(int(row['timeout'])) + ' s':>10}")
                continue
            shown = f"{row['s'] * 1e3:.1f} ms" if row["s"] < 1 else f"{row['s']:.2f} s"
            print(
                f"{family:<7} {method:<11} {shown:>10} {row['mib']:>9.1f} {row['path']:<11} {row['value']:.10g}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
