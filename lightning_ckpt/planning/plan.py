"""`CheckpointPlan`: what AutoCheckpoint decided, and a readable report of it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_ckpt.units import BYTES_PER_GB, BYTES_PER_MB


@dataclass(frozen=True)
class PlanItem:
    """One candidate module as the plan saw it (plain data, safe to save in a checkpoint).

    Example:
        >>> PlanItem("h.0", activation_bytes=4_000_000, input_bytes=1_000_000, recompute_seconds=0.002)
        PlanItem(name='h.0', activation_bytes=4000000, input_bytes=1000000, recompute_seconds=0.002, flops=0, keep_bytes=0)
    """

    name: str
    activation_bytes: int
    input_bytes: int
    recompute_seconds: float
    flops: int = 0
    keep_bytes: int = 0
    """What the knapsack weighed: the most bytes keeping it adds to any point of the predicted peak."""


@dataclass(frozen=True)
class CheckpointPlan:
    """Which candidate modules are checkpointed, and what that costs and saves.

    Byte counts are per device. ``measured_peak_bytes`` is ``None`` until a step has run with the plan.

    Example:
        >>> plan = CheckpointPlan(
        ...     checkpointed=("h.1",), kept=("h.0",),
        ...     items=(PlanItem("h.0", 4_000_000, 1_000_000, 0.002), PlanItem("h.1", 4_000_000, 1_000_000, 0.003)),
        ...     static_bytes=10_000_000, budget_bytes=20_000_000, predicted_peak_bytes=19_000_000,
        ...     recompute_seconds=0.003, solver_method="hirschberg", solver_seconds=0.0001)
        >>> plan.with_measured_peak(18_500_000).measured_peak_bytes
        18500000
        >>> CheckpointPlan.from_dict(plan.to_dict()) == plan
        True
    """

    checkpointed: tuple[str, ...]
    kept: tuple[str, ...]
    items: tuple[PlanItem, ...]
    static_bytes: int
    budget_bytes: int
    predicted_peak_bytes: int
    recompute_seconds: float
    solver_method: str
    solver_seconds: float
    measured_peak_bytes: int | None = None
    replanned: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def fits(self) -> bool:
        """Whether the measured peak (or, before measuring, the predicted one) is within the budget."""
        peak = self.predicted_peak_bytes if self.measured_peak_bytes is None else self.measured_peak_bytes
        return peak <= self.budget_bytes

    def with_measured_peak(self, measured_peak_bytes: int) -> CheckpointPlan:
        """A copy of the plan with the measured peak filled in."""
        return dataclasses.replace(self, measured_peak_bytes=int(measured_peak_bytes))

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, numbers, strings) for checkpoints and JSON."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckpointPlan:
        """Inverse of :meth:`to_dict`, checking every field (the data may come from a damaged file).

        Raises:
            ValueError: naming the first field that is missing, unknown or of the wrong type, or when
                ``checkpointed`` and ``kept`` do not split the items' names.

        Example:
            >>> CheckpointPlan.from_dict({"checkpointed": 5})
            Traceback (most recent call last):
            ...
            ValueError: a saved plan must have the fields ..., got ['checkpointed']
        """
        if not isinstance(data, dict) or set(data) - _FIELDS or _REQUIRED - set(data):
            got = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ValueError(
                f"a saved plan must have the fields {sorted(_REQUIRED)} (and optionally {sorted(_FIELDS - _REQUIRED)}), got {got}"
            )
        data = dict(data)
        if not isinstance(data["items"], (list, tuple)) or not all(
            isinstance(i, dict) for i in data["items"]
        ):
            raise ValueError(f"a saved plan's `items` must be a list of dicts, got {data['items']!r:.80}")
        data["items"] = tuple(_checked(PlanItem, item) for item in data["items"])
        for key in ("checkpointed", "kept", "notes"):
            if isinstance(data.get(key, ()), (list, tuple)):
                data[key] = tuple(data.get(key, ()))
        plan = _checked(cls, data)
        names = [item.name for item in plan.items]
        if sorted(plan.checkpointed + plan.kept) != sorted(names) or len(set(names)) != len(names):
            raise ValueError("a saved plan's `checkpointed` and `kept` must split its items' names")
        return plan

    def metrics(self) -> dict[str, float]:
        """Scalars for the trainer's logger (GB, counts, seconds)."""
        out = {
            "autockpt/predicted_peak_gb": self.predicted_peak_bytes / BYTES_PER_GB,
            "autockpt/budget_gb": self.budget_bytes / BYTES_PER_GB,
            "autockpt/num_checkpointed": float(len(self.checkpointed)),
            "autockpt/recompute_ms_per_step": self.recompute_seconds * 1e3,
        }
        if self.measured_peak_bytes is not None:
            out["autockpt/measured_peak_gb"] = self.measured_peak_bytes / BYTES_PER_GB
        return out

    def __str__(self) -> str:
        return format_plan_table(self)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_names(x: object) -> bool:
    return isinstance(x, tuple) and all(isinstance(name, str) for name in x)


_CHECKS = {  # field type (as annotated) -> whether a value is of it
    "str": lambda x: isinstance(x, str),
    "int": _is_int,
    "float": lambda x: _is_int(x) or isinstance(x, float),
    "bool": lambda x: isinstance(x, bool),
    "int | None": lambda x: x is None or _is_int(x),
    "tuple[str, ...]": _is_names,
    "tuple[PlanItem, ...]": lambda x: isinstance(x, tuple) and all(isinstance(i, PlanItem) for i in x),
}


def _checked(cls: type, data: dict[str, Any]) -> Any:
    """``cls(**data)`` once every field is present, known and of its annotated type."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    required = {name for name, f in fields.items() if f.default is f.default_factory is dataclasses.MISSING}
    if set(data) - set(fields) or required - set(data):
        raise ValueError(
            f"a saved {cls.__name__} must have the fields {sorted(required)}, got {sorted(data)}"
        )
    for name, value in data.items():
        if not _CHECKS[fields[name].type](value):
            raise ValueError(
                f"a saved {cls.__name__}'s `{name}` must be {fields[name].type}, got {value!r:.80}"
            )
    return cls(**data)


def format_plan_table(plan: CheckpointPlan) -> str:
    """The plan as a fixed-width table with totals (what the callback logs on rank 0).

    "saved MB" is what the knapsack weighed for a checkpointed module: the most bytes keeping it would
    add to any point of the predicted peak. A plan without recompute times (planned offline without a
    device speed) shows each module's recompute cost in forward GFLOP instead.
    """
    checkpointed = set(plan.checkpointed)
    timed = _timed(plan)
    rows = [_item_row(item, item.name in checkpointed, timed) for item in plan.items]
    header = (
        "module",
        "activations MB",
        "saved MB",
        "recompute ms" if timed else "recompute GFLOP",
        "decision",
    )
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [_fmt_row(header, widths), _fmt_row(tuple("-" * w for w in widths), widths)]
    lines += [_fmt_row(row, widths) for row in rows]
    lines += ["", *_summary_lines(plan)]
    return "\n".join(lines)


_FIELDS = {f.name for f in dataclasses.fields(CheckpointPlan)}
_REQUIRED = {
    f.name
    for f in dataclasses.fields(CheckpointPlan)
    if f.default is f.default_factory is dataclasses.MISSING
}


def _item_row(item: PlanItem, is_checkpointed: bool, timed: bool) -> tuple[str, ...]:
    saved_mb = item.keep_bytes / BYTES_PER_MB if is_checkpointed else 0.0
    cost = f"{item.recompute_seconds * 1e3:.3f}" if timed else f"{item.flops / 1e9:.3f}"
    return (
        item.name,
        f"{item.activation_bytes / BYTES_PER_MB:.2f}",
        f"{saved_mb:.2f}",
        cost,
        "checkpoint" if is_checkpointed else "keep",
    )


def _timed(plan: CheckpointPlan) -> bool:
    """Whether the plan has recompute times (an offline plan without a device speed has only FLOPs)."""
    return any(item.recompute_seconds for item in plan.items) or not any(item.flops for item in plan.items)


def _fmt_row(cells: Sequence[str], widths: Sequence[int]) -> str:
    first = f"{cells[0]:<{widths[0]}}"
    rest = [f"{cell:>{width}}" for cell, width in zip(cells[1:], widths[1:], strict=True)]
    return "  ".join([first, *rest])


def _summary_lines(plan: CheckpointPlan) -> list[str]:
    measured = (
        "not yet" if plan.measured_peak_bytes is None else f"{plan.measured_peak_bytes / BYTES_PER_GB:.4f} GB"
    )
    if _timed(plan):
        recompute = f"+{plan.recompute_seconds * 1e3:.2f} ms recompute per step"
    else:
        flops = sum(item.flops for item in plan.items if item.name in set(plan.checkpointed))
        recompute = f"+{flops / 1e9:.3f} GFLOP recompute per step; no recompute times were measured"
    lines = [
        f"checkpointed {len(plan.checkpointed)} of {len(plan.items)} modules ({recompute})",
        f"budget {plan.budget_bytes / BYTES_PER_GB:.4f} GB | static {plan.static_bytes / BYTES_PER_GB:.4f} GB"
        f" | predicted peak {plan.predicted_peak_bytes / BYTES_PER_GB:.4f} GB | measured peak {measured}",
        f"solver {plan.solver_method} in {plan.solver_seconds * 1e3:.2f} ms",
    ]
    return lines + [f"note: {note}" for note in plan.notes]
