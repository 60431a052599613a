"""Apply a plan to the live model: full checkpointing and, at op level, selective policies.

Only what changes is touched: when every module wrapped now is wanted under the same policy, the
missing ones are wrapped; otherwise everything is unwrapped and the plan applied afresh. Both kinds are
this package's removable hooks (``state_dict`` keys unchanged).

Example:
    >>> import torch
    >>> from lightning_ckpt.planning.plan import CheckpointPlan, PlanItem
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    >>> items = (PlanItem("0", 1, 1, 0.1, option="checkpoint"),
    ...          PlanItem("1", 1, 1, 0.1, option="mm", saved_ops=(("aten.addmm.default", 0),)))
    >>> plan = CheckpointPlan(("0", "1"), (), items, 0, 10, 5, 0.2, "auto", 0.0)
    >>> apply_plan(model, plan)
    >>> current_policies(model)
    {'0': None, '1': SelectivePolicy(saved=frozenset({('aten.addmm.default', 0)}))}
"""

from __future__ import annotations

import torch.nn as nn

from lightning_ckpt.core.selective import apply_selective_checkpointing, selective_policy_of
from lightning_ckpt.core.selective.policy import SelectivePolicy
from lightning_ckpt.core.wrapping import (
    apply_checkpointing,
    is_checkpointed,
    remove_checkpointing,
    strip_wrapper_prefixes,
)
from lightning_ckpt.planning.plan import CheckpointPlan

__all__ = ["apply_plan", "current_policies", "wanted_policies"]


def wanted_policies(plan: CheckpointPlan) -> dict[str, SelectivePolicy | None]:
    """Each module the plan checkpoints, with its selective policy (None: full checkpoint)."""
    saved = {item.name: item.saved_ops for item in plan.items}
    return {
        name: SelectivePolicy(frozenset(saved[name])) if saved.get(name) else None
        for name in plan.checkpointed
    }


def current_policies(model: nn.Module) -> dict[str, SelectivePolicy | None]:
    """Each module this package checkpoints now, with its selective policy (None: full checkpoint)."""
    return {
        strip_wrapper_prefixes(name): selective_policy_of(module)
        for name, module in model.named_modules()
        if is_checkpointed(module)
    }


def apply_plan(model: nn.Module, plan: CheckpointPlan) -> None:
    """Checkpoint exactly ``plan.checkpointed``, each under its option's policy."""
    wanted, current = wanted_policies(plan), current_policies(model)
    if any(name not in wanted or wanted[name] != policy for name, policy in current.items()):
        remove_checkpointing(model)
        current = {}
    full = [name for name in plan.checkpointed if name not in current and wanted[name] is None]
    if full:
        apply_checkpointing(model, full)
    selective = {
        name: policy for name, policy in wanted.items() if name not in current and policy is not None
    }
    if selective:
        apply_selective_checkpointing(model, selective)
