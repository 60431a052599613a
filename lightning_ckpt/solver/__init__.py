"""Exact 0/1 knapsack solver in O(W) memory (imports neither torch nor lightning).

Example:
    >>> from lightning_ckpt.solver import solve_knapsack
    >>> solve_knapsack([3, 4, 5], [4.0, 5.0, 6.0], 8).chosen
    (0, 2)
"""

from lightning_ckpt.solver.api import KnapsackResult, SolveStats, solve_knapsack
from lightning_ckpt.solver.options import SolverOptions
from lightning_ckpt.solver.quantize import quantize
from lightning_ckpt.solver.runtime.backend import KERNEL

__all__ = ["KERNEL", "KnapsackResult", "SolveStats", "SolverOptions", "quantize", "solve_knapsack"]
