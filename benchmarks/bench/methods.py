"""The methods the benchmark compares: what each one needs, whether it is exact, how its work is costed."""

from __future__ import annotations

from dataclasses import dataclass

SCALE = 10_000  # torch's knapsack functions multiply float weights by this and round
TORCH_REFERENCE = "torch-sliding"


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
        _Method("auto", _OURS, True, False, 0, 1e-6),  # sparse states first: its time follows no n*W
        _Method("auto-dense", _OURS, True, True, 0, 1e-9),  # "auto" without the sparse try: the old path
        _Method("dp", _OURS, True, True, 8, 1e-9),  # float64 table
        _Method("torch-dp", _TORCH, True, True, 4, 2e-9),  # float32 table
        _Method("torch-sliding", _TORCH, True, True, 0, 2e-9),
        _Method("greedy", _OURS, False, False, 0, 1e-6),
        _Method("ilp", _SCIPY, True, False, 0, 1e-3),
    )
}
_OUR_CALLS = {  # method: (solve_knapsack's method, workers, SolverOptions fields)
    "hirschberg": ("hirschberg", 1, {}),
    "hirschberg-w2": ("hirschberg", 2, {}),
    "auto": ("auto", 1, {}),
    "auto-dense": ("auto", 1, {"sparse_max_states": 0}),
    "dp": ("dp", 1, {}),
    "greedy": ("greedy", 1, {}),
    "ilp": ("ilp", 1, {}),
}
