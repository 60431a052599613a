"""`CheckpointPlan`: what AutoCheckpoint decided, and a readable report of it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_ckpt.planning.plan_checks import check_plan_data
from lightning_ckpt.units import BYTES_PER_GB, BYTES_PER_MB


@dataclass(frozen=True)
class PlanItem:
    """One candidate module as the plan saw it (plain data, safe to save in a checkpoint).

    Example:
        >>> item = PlanItem("h.0", activation_bytes=4_000_000, input_bytes=1_000_000, recompute_seconds=0.002)
        >>> item.keep_bytes, item.option, item.selective
        (0, '', False)
    """

    name: str
    activation_bytes: int
    input_bytes: int
    recompute_seconds: float
    flops: int = 0
    keep_bytes: int = 0
    """What the knapsack weighed: the most bytes keeping it adds to any point of the predicted peak."""
    option: str = ""
    """Op-level plans (``granularity="op"``): the option chosen, ``"keep"``, ``"checkpoint"`` or a
    selective rule's name; ``""`` in a block-level plan (kept or checkpointed as the plan's lists say)."""
    saved_ops: tuple[tuple[str, int], ...] = ()
    """A selective option's saved op calls, ``(op name, occurrence)`` as its policy names them."""
    option_seconds: float | None = None
    """The chosen option's recompute per step (SAC's overhead included); None in a block-level plan."""
    option_flops: int | None = None
    """The chosen option's recomputed forward FLOPs in an op-level plan priced in FLOPs, else None."""

    @property
    def selective(self) -> bool:
        """Whether the item runs under a selective policy (it is among the plan's checkpointed)."""
        return bool(self.saved_ops)


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

    @property
    def recompute_flops(self) -> int:
        """Forward FLOPs the backward recomputes: each checkpointed module's forward, or its option's
        recomputed calls where the plan was priced in FLOPs at op level."""
        checkpointed = set(self.checkpointed)
        return sum(
            item.flops if item.option_flops is None else item.option_flops
            for item in self.items
            if item.name in checkpointed
        )

    def with_measured_peak(self, measured_peak_bytes: int) -> CheckpointPlan:
        """A copy of the plan with the measured peak filled in."""
        return dataclasses.replace(self, measured_peak_bytes=int(measured_peak_bytes))

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, numbers, strings) for checkpoints and JSON."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckpointPlan:
        """Inverse of :meth:`to_dict`, checking every field (the data may come from a damaged or edited
        file): see :func:`~lightning_ckpt.planning.plan_checks.check_plan_data`.

        Raises:
            ValueError: the first problem of the data, naming the field, what is allowed and what was
                given (and how many more problems there are).

        Example:
            >>> CheckpointPlan.from_dict({"checkpointed": 5})
            Traceback (most recent call last):
            ...
            ValueError: a saved plan must have the fields [...] (and optionally [...]), got missing ['budget_bytes', ...]
        """
        problems = check_plan_data(data)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise ValueError(problems[0] + more)
        items = tuple(PlanItem(**_item_data(item)) for item in data["items"])
        names = {key: tuple(data.get(key, ())) for key in ("checkpointed", "kept", "notes")}
        return cls(**(data | names | {"items": items}))

    @property
    def selective(self) -> tuple[str, ...]:
        """The checkpointed items that run under a selective policy (op-level plans)."""
        return tuple(item.name for item in self.items if item.selective)

    def metrics(self) -> dict[str, float]:
        """Scalars for the trainer's logger (GB, counts, seconds)."""
        out = {
            "autockpt/predicted_peak_gb": self.predicted_peak_bytes / BYTES_PER_GB,
            "autockpt/budget_gb": self.budget_bytes / BYTES_PER_GB,
            "autockpt/num_checkpointed": float(len(self.checkpointed)),
            "autockpt/recompute_ms_per_step": self.recompute_seconds * 1e3,
        }
        if self.selective:
            out["autockpt/num_selective"] = float(len(self.selective))
        if self.measured_peak_bytes is not None:
            out["autockpt/measured_peak_gb"] = self.measured_peak_bytes / BYTES_PER_GB
        return out

    def __str__(self) -> str:
        return format_plan_table(self)


def _item_data(item: dict[str, Any]) -> dict[str, Any]:
    """A saved item's fields, its saved op calls as tuples again (JSON and checkpoints give lists)."""
    return item | {"saved_ops": tuple((str(op), int(n)) for op, n in item.get("saved_ops", ()))}


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
    if any(item.option for item in plan.items):  # op level: each block's option, its recompute
        header += ("option", "option ms" if timed else "option GFLOP")
        rows = [row + _option_cells(item, timed) for row, item in zip(rows, plan.items, strict=True)]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [_fmt_row(header, widths), _fmt_row(tuple("-" * w for w in widths), widths)]
    lines += [_fmt_row(row, widths) for row in rows]
    lines += ["", *_summary_lines(plan)]
    return "\n".join(lines)


def _item_row(item: PlanItem, is_checkpointed: bool, timed: bool) -> tuple[str, ...]:
    saved_mb = item.keep_bytes / BYTES_PER_MB if is_checkpointed else 0.0
    cost = f"{item.recompute_seconds * 1e3:.3f}" if timed else f"{item.flops / 1e9:.3f}"
    return (
        item.name,
        f"{item.activation_bytes / BYTES_PER_MB:.2f}",
        f"{saved_mb:.2f}",
        cost,
        "selective" if item.selective else "checkpoint" if is_checkpointed else "keep",
    )


def _option_cells(item: PlanItem, timed: bool) -> tuple[str, str]:
    ops = (
        f" ({len(item.saved_ops)} op{'s' if len(item.saved_ops) != 1 else ''} saved)"
        if item.saved_ops
        else ""
    )
    if timed:
        return f"{item.option}{ops}", f"{(item.option_seconds or 0.0) * 1e3:.3f}"
    flops = item.option_flops
    return f"{item.option}{ops}", "-" if flops is None else f"{flops / 1e9:.3f}"


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
        recompute = (
            f"+{plan.recompute_flops / 1e9:.3f} GFLOP recompute per step; no recompute times were measured"
        )
    selective = f", {len(plan.selective)} of them selective" if plan.selective else ""
    lines = [
        f"checkpointed {len(plan.checkpointed)} of {len(plan.items)} modules{selective} ({recompute})",
        f"budget {plan.budget_bytes / BYTES_PER_GB:.4f} GB | static {plan.static_bytes / BYTES_PER_GB:.4f} GB"
        f" | predicted peak {plan.predicted_peak_bytes / BYTES_PER_GB:.4f} GB | measured peak {measured}",
        f"solver {plan.solver_method} in {plan.solver_seconds * 1e3:.2f} ms",
    ]
    return lines + [f"note: {note}" for note in plan.notes]
