"""lightning_ckpt: exact, automatic activation checkpointing for PyTorch Lightning.

Public names are imported lazily so that ``lightning_ckpt.solver`` (and the worker
processes it starts) never pays for importing torch or lightning.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "solve_knapsack": "lightning_ckpt.solver",
    "KnapsackResult": "lightning_ckpt.solver",
    "quantize": "lightning_ckpt.solver",
    "SolveStats": "lightning_ckpt.solver",
    "SolverOptions": "lightning_ckpt.solver",
    "AutoCheckpointConfig": "lightning_ckpt.config",
    "BudgetTooSmallError": "lightning_ckpt.planning",
    "RankFailedError": "lightning_ckpt.lightning.ranks",
    "memory_cap": "lightning_ckpt.testing",
    "find_candidates": "lightning_ckpt.core.candidates",
    "ModuleProfile": "lightning_ckpt.core.profile_types",
    "StepProfile": "lightning_ckpt.core.profile_types",
    "profile_step": "lightning_ckpt.core.profiler",
    "predict_peak_bytes": "lightning_ckpt.planning",
    "measure_peak_bytes": "lightning_ckpt.core.memory.meter",
    "apply_checkpointing": "lightning_ckpt.core.wrapping",
    "remove_checkpointing": "lightning_ckpt.core.wrapping",
    "CheckpointPlan": "lightning_ckpt.planning",
    "make_plan": "lightning_ckpt.planning",
    "AutoCheckpoint": "lightning_ckpt.callback",
    "plan_offline": "lightning_ckpt.offline.plan",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'lightning_ckpt' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
