"""``python -m benchmarks.bench.choices``: op-level solves (one option per block) at GPT-2 XL's scale.

Issue 24's instance: 48 blocks x 5 options (full checkpoint, three selective policies, keep) at the
GPT-2 XL FSDP2 config's budget, 72 GB at 512-byte quanta (W = 140,625,000 quanta). Each block keeps
1.95 GB for backward when kept (3,808,594 quanta; its width varies by a few percent, as profiled
blocks do); a selective policy keeps a share of that and saves a share of the recompute (the shares
vary per block): keep > all matmuls > every other matmul > SDPA only > full checkpoint in weight and
in value. A block's cap is what its backward allows before it: the budget less twice its activations
and, for every byte it does not keep, half a byte of recompute temporaries (the 0/1 instance of
``benchmarks.bench.fresh``, per option). Prints, side by side, ``solve_choices`` ("auto") first in a
fresh process and then warm (best of repeats), and the block-level 0/1 solve of the same blocks
(keep or checkpoint only) with ``solve_knapsack``; with ``--check``, the dense path on the same
instance at a coarser quantum against "auto" there (the same value).

Example::

    python -m benchmarks.bench.choices --blocks 48 --options 5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

from benchmarks.bench.fresh import child_line

BUDGET_BYTES = 72 * 10**9
QUANTUM_BYTES = 512
BLOCK_BYTES = 1.95e9  # GPT-2 XL under FSDP2 bf16-mixed, 32 x 1024 tokens: what a kept block holds

_FRESH = """
import json, time
with open({path!r}) as f:
    weights, values, capacity, caps = json.load(f)
t0 = time.perf_counter()
from lightning_ckpt.solver import solve_choices
t1 = time.perf_counter()
result = solve_choices(weights, values, capacity, prefix_capacities=caps)
t2 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "solve_s": t2 - t1, "value": result.value}}))
"""


def choice_instance(blocks: int, options: int, quantum_bytes: int = QUANTUM_BYTES, seed: int = 0):
    """``(weights, values, capacity, caps)`` as nested lists, option 0 the full checkpoint (weight 0)
    and option ``options - 1`` keep."""
    rng = np.random.default_rng(seed)
    capacity = BUDGET_BYTES // quantum_bytes
    keep = np.rint(BLOCK_BYTES / quantum_bytes * rng.uniform(0.97, 1.03, blocks)).astype(np.int64)
    forward_ms = rng.uniform(0.9, 1.1, blocks)
    middle = max(options - 2, 0)
    weight_share = np.sort(rng.uniform(0.15, 0.7, (blocks, middle)), axis=1)
    value_share = np.sort(rng.uniform(0.35, 0.95, (blocks, middle)), axis=1)  # saves more than it keeps
    shares_w = np.column_stack((np.zeros(blocks), weight_share, np.ones(blocks)))[:, :options]
    shares_v = np.column_stack((np.zeros(blocks), value_share, np.ones(blocks)))[:, :options]
    weights = np.rint(shares_w * keep[:, None]).astype(np.int64)
    values = shares_v * forward_ms[:, None]
    caps = np.maximum(capacity - 2 * keep[:, None] - (keep[:, None] - weights) // 2, 0)
    return weights.tolist(), values.tolist(), int(capacity), caps.tolist()


def _best_s(call, budget_s: float = 1.0) -> float:
    times, spent = [], 0.0
    while not times or (spent < budget_s and len(times) < 20):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
        spent += times[-1]
    return min(times)


def _fresh(instance) -> dict:
    """The first solve of a fresh process (the instance read from a file before the clock starts)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
        json.dump(list(instance), file)
    try:
        return json.loads(child_line(_FRESH.format(path=file.name)))
    finally:
        os.unlink(file.name)


def _block_level(weights, values, capacity, caps):
    """The same blocks, keep or full checkpoint only: the 0/1 capped solve of today's planner."""
    from lightning_ckpt.solver import solve_knapsack

    keep = [group[-1] for group in weights]
    return lambda: solve_knapsack(
        keep,
        [group[-1] for group in values],
        capacity,
        prefix_capacities=[group[-1] for group in caps],
        skip_capacities=[group[0] for group in caps],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench.choices", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--blocks", nargs="+", type=int, default=[48], help="blocks (groups)")
    parser.add_argument("--options", nargs="+", type=int, default=[5], help="options per block")
    parser.add_argument("--quantum-bytes", type=int, default=QUANTUM_BYTES, help="bytes per weight unit")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="instance seeds")
    parser.add_argument("--check", type=int, default=0, help="also the dense path at this coarser quantum")
    args = parser.parse_args(argv)
    from lightning_ckpt.solver import solve_choices

    print(
        f"{'blocks':>6} {'opts':>4} {'seed':>4} {'W':>11}  {'path':<8} {'entries':>8} {'fresh ms':>9}"
        f" {'warm ms':>8} {'0/1 warm ms':>11} {'op value':>9} {'0/1 value':>9}"
    )
    for blocks in args.blocks:
        for options in args.options:
            for seed in args.seeds:
                inst = choice_instance(blocks, options, args.quantum_bytes, seed)
                solve = lambda inst=inst: solve_choices(*inst[:3], prefix_capacities=inst[3])  # noqa: E731
                result, block = solve(), _block_level(*inst)()
                fresh = _fresh(inst)
                assert abs(fresh["value"] - result.value) <= 1e-9 * result.value
                print(
                    f"{blocks:>6} {options:>4} {seed:>4} {inst[2]:>11}  {result.stats.path:<8}"
                    f" {result.stats.cell_updates:>8} {fresh['solve_s'] * 1e3:>9.2f} {_best_s(solve) * 1e3:>8.2f}"
                    f" {_best_s(_block_level(*inst)) * 1e3:>11.2f} {result.value:>9.4f} {block.value:>9.4f}"
                )
                if args.check:
                    _check(blocks, options, seed, args.check)
    return 0


def _check(blocks: int, options: int, seed: int, quantum_bytes: int) -> None:
    from lightning_ckpt.solver import solve_choices

    inst = choice_instance(blocks, options, quantum_bytes, seed)
    start = time.perf_counter()
    dense = solve_choices(*inst[:3], prefix_capacities=inst[3], method="hirschberg")
    dense_s = time.perf_counter() - start
    auto = solve_choices(*inst[:3], prefix_capacities=inst[3])
    same = abs(dense.value - auto.value) <= 1e-9 * max(auto.value, 1e-300)
    print(
        f"  check at {quantum_bytes}-byte quanta (W = {inst[2]}): dense {dense_s:.2f} s, value {dense.value:.6f},"
        f" auto {auto.value:.6f}: {'same' if same else 'DIFFERENT'}"
    )


if __name__ == "__main__":
    sys.exit(main())
