"""``lightning-ckpt bench --prefix``: the knapsack with prefix capacities (exact peak planning) side by
side with the additive solve (the plan before) and, where it can run, brute force.

Instances (family ``P``, transformer-like): layers of three module kinds whose sizes change from layer
to layer (heterogeneous blocks), then a large head (6x a block). Item ``i`` is kept (value: its
recompute time, about proportional to its size) or checkpointed. At its backward, its own activations
and a backward temporary are alive besides the kept items before it; checkpointed, its recompute's
temporaries too: caps ``W - own - temp`` (taken) and ``W - own - temp - recompute`` (not taken).
The additive solve is the same items with the tightest cap as capacity: a feasible, cheaper bound.

Each method runs in a fresh ``python -c`` process (killed past ``--max-seconds``) that loads and calls
the numba kernels first; times are of the solve call alone, the best of a few calls when it is short.
Ratios are printed against the additive solve of the same instance, in the same run.

Example:
    >>> instance = make_prefix_instance(6, 1000, seed=0)
    >>> len(instance.weights), instance.capacity, bool(instance.skip[-1] <= instance.take[-1])
    (6, 1000, True)
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass

import numpy as np

__all__ = ["PREFIX_METHODS", "PrefixInstance", "make_prefix_instance", "run_prefix", "format_prefix"]

PREFIX_METHODS = ("prefix", "prefix-w2", "additive", "brute")
BRUTE_MAX_ITEMS = 18
_KINDS = (1.0, 2.5, 0.6)  # attention-like, MLP-like, norm-like sizes in a layer


@dataclass(frozen=True, eq=False)
class PrefixInstance:
    """Items in forward order with their take/skip caps and the total capacity W."""

    n: int
    capacity: int
    seed: int
    weights: np.ndarray
    values: np.ndarray
    take: np.ndarray
    skip: np.ndarray


def make_prefix_instance(n: int, capacity: int, seed: int = 0) -> PrefixInstance:
    """The seeded family-P instance with ``n`` items (the last is the head) and capacity ``capacity``."""
    rng = np.random.default_rng(seed)
    layers = max(1, math.ceil((n - 1) / len(_KINDS)))
    widths = rng.uniform(0.5, 2.0, layers)  # per layer: blocks of mixed widths
    sizes = np.array([_KINDS[i % len(_KINDS)] * widths[i // len(_KINDS)] for i in range(n - 1)])
    sizes = np.append(sizes, 6.0 * sizes.mean()) if n > 1 else np.array([1.0])
    scale = min(2.5 * capacity / sizes.sum(), 0.25 * capacity / sizes.max())  # <= 40% can be kept
    weights = np.maximum(1, np.rint(sizes * scale)).astype(np.int64)
    values = weights * rng.uniform(0.5, 1.5, n)
    temporary = np.rint(weights * rng.uniform(0.05, 0.3, n)).astype(np.int64)
    recompute = np.rint(weights * rng.uniform(0.1, 0.5, n)).astype(np.int64)
    take = np.maximum(capacity - weights - temporary, 0)
    skip = np.maximum(take - recompute, 0)
    return PrefixInstance(n, capacity, seed, weights, values, take, skip)


def _child(method: str, n: int, capacity: int, seed: int, repeat_budget_s: float) -> dict:
    """Run one method on one instance in this (fresh) process: the best time and the answer."""
    import time

    from lightning_ckpt.solver import solve_knapsack
    from lightning_ckpt.solver.runtime import backend

    if backend.KERNEL == "numba":  # load the compiled kernels first: steady-state times for all
        backend.load_numba()
        _warm_up()
    instance = make_prefix_instance(n, capacity, seed)
    args = (instance.weights, instance.values)
    if method == "additive":
        cap = int(min(capacity, instance.take.min(), instance.skip.min()))
        call = lambda: solve_knapsack(*args, cap).chosen  # noqa: E731
    elif method == "brute":
        call = lambda: _brute_force(instance)  # noqa: E731
    else:
        caps = {"prefix_capacities": instance.take, "skip_capacities": instance.skip}
        workers = 2 if method == "prefix-w2" else 1
        call = lambda: solve_knapsack(*args, capacity, workers=workers, **caps).chosen  # noqa: E731
    times, spent = [], 0.0
    while not times or (spent < repeat_budget_s and len(times) < 5):
        start = time.perf_counter()
        chosen = call()
        times.append(time.perf_counter() - start)
        spent += times[-1]
    mask = np.zeros(n, dtype=bool)
    mask[list(chosen)] = True
    return {"time_s": min(times), "value": float(instance.values[mask].sum()), "fits": _fits(instance, mask)}


def _warm_up() -> None:
    """Call every compiled kernel once (numba loads each from its cache on the first call)."""
    from lightning_ckpt.solver import SolverOptions, solve_knapsack

    small, deep = make_prefix_instance(12, 1000, seed=1), SolverOptions(leaf_max_cells=0)
    caps = {"prefix_capacities": small.take, "skip_capacities": small.skip}
    for method in ("auto", "hirschberg"):
        solve_knapsack(small.weights, small.values, 1000, method=method, options=deep)
    solve_knapsack(small.weights, small.values, 1000, method="hirschberg", options=deep, **caps)
    solve_knapsack(small.weights, small.values, 1000, method="hirschberg", **caps)


def _fits(instance: PrefixInstance, mask: np.ndarray) -> bool:
    before = np.cumsum(instance.weights * mask) - instance.weights * mask
    caps = np.where(mask, instance.take, instance.skip)
    return bool((before <= caps).all() and (instance.weights * mask).sum() <= instance.capacity)


def _brute_force(instance: PrefixInstance) -> tuple[int, ...]:
    """The best feasible subset by enumeration (chunks of 2**14 sets)."""
    n, best, best_value = instance.n, (), -1.0
    for start in range(0, 2**n, 2**14):
        codes = np.arange(start, min(2**n, start + 2**14))
        masks = ((codes[:, None] >> np.arange(n)) & 1).astype(bool)
        chosen_weights = masks * instance.weights
        before = np.cumsum(chosen_weights, axis=1) - chosen_weights
        ok = np.where(masks, before <= instance.take, before <= instance.skip).all(axis=1)
        ok &= chosen_weights.sum(axis=1) <= instance.capacity
        totals = np.where(ok, masks @ instance.values, -1.0)
        if totals.max() > best_value:
            best_value, best = (
                float(totals.max()),
                tuple(np.flatnonzero(masks[int(totals.argmax())]).tolist()),
            )
    return best


def _run_child(method: str, n: int, capacity: int, seed: int, max_seconds: float) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    code = (
        "import json, sys; from benchmarks.bench.prefix import _child; "
        f"print(json.dumps(_child({method!r}, {n}, {capacity}, {seed}, 0.5)))"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=max_seconds
        )
    except subprocess.TimeoutExpired:
        return {"status": f"timeout (> {max_seconds:g} s)"}
    if done.returncode:
        return {"status": "error", "note": done.stderr.strip().splitlines()[-1:]}
    return {"status": "ok", **json.loads(done.stdout.strip().splitlines()[-1])}


def run_prefix(ns, capacities, methods, seed: int, max_seconds: float) -> list[dict]:
    """Every method on every (n, W): rows with ratios against the additive solve of the same instance."""
    rows = []
    for n in ns:
        for capacity in capacities:
            results = {}
            for method in methods:
                if method == "brute" and n > BRUTE_MAX_ITEMS:
                    results[method] = {"status": f"n/a (n > {BRUTE_MAX_ITEMS})"}
                    continue
                results[method] = _run_child(method, n, capacity, seed, max_seconds)
            base = results.get("additive", {})
            best = results.get("brute", {}).get("value")
            for method, row in results.items():
                rows.append({"n": n, "W": capacity, "method": method, **row, **_ratios(row, base, best)})
    return rows


def _ratios(row: dict, additive: dict, brute_value: float | None) -> dict:
    if row.get("status") != "ok":
        return {}
    out = {}
    if additive.get("status") == "ok":
        out["value_vs_additive"] = _ratio(row["value"], additive["value"])
        out["time_vs_additive"] = row["time_s"] / additive["time_s"]
    if brute_value is not None:
        out["gap_vs_brute"] = (brute_value - row["value"]) / brute_value if brute_value else 0.0
    return out


def _ratio(value: float, reference: float) -> float:
    """``value / reference``, ``inf`` over a zero reference (1 when both are zero)."""
    if reference:
        return value / reference
    return math.inf if value else 1.0


def format_prefix(rows: list[dict]) -> str:
    """The rows as a table: time, value and the ratios against the additive solve and brute force."""
    header = f"{'n':>5} {'W':>10} {'method':<10} {'status':<8} {'time_ms':>10} {'value/add':>9} {'time/add':>9} {'gap/brute':>9} fits"
    lines = [header]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"{r['n']:>5} {r['W']:>10} {r['method']:<10} {r['status']}")
            continue
        cells = [
            f"{r.get(k, math.nan):>9.4f}" for k in ("value_vs_additive", "time_vs_additive", "gap_vs_brute")
        ]
        lines.append(
            f"{r['n']:>5} {r['W']:>10} {r['method']:<10} {'ok':<8} {r['time_s'] * 1e3:>10.2f} {' '.join(cells)} {r['fits']}"
        )
    return "\n".join(lines)
