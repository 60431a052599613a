"""Checks of a saved plan's data, field by field, before it becomes a `CheckpointPlan`.

A saved plan comes from a checkpoint, a JSON file or another rank, and may be damaged or hand-edited.
:func:`check_plan_data` says everything wrong with it, one line per problem: a field missing, unknown or
of the wrong type; a number negative, not finite or beyond what any device reaches; or fields that
contradict each other (a predicted peak over the budget the plan claims, a recompute total that is not
the sum of its checkpointed items, ``checkpointed`` and ``kept`` that do not split the items' names, a
measured peak below half the plan's own static memory, or over its budget in a plan not re-planned). It checks the data alone; whether the names are
candidates of a live model is :meth:`lightning_ckpt.lightning.plan_book.PlanBook.non_candidates`.

Example:
    >>> item = {"name": "h.0", "activation_bytes": 10, "input_bytes": 1, "recompute_seconds": 0.5}
    >>> plan = {"checkpointed": ["h.0"], "kept": [], "items": [item], "static_bytes": 100,
    ...         "budget_bytes": 200, "predicted_peak_bytes": 150, "recompute_seconds": 0.5,
    ...         "solver_method": "auto (prefix capacities)", "solver_seconds": 0.001}
    >>> check_plan_data(plan)
    []
    >>> check_plan_data(plan | {"solver_seconds": float("nan"), "static_bytes": -1})
    ["a saved plan's `static_bytes` must be an integer number of bytes from 0 to 1e+18, got -1",
     "a saved plan's `solver_seconds` must be a finite number of seconds from 0 to 86400, got nan"]
    >>> check_plan_data(plan | {"predicted_peak_bytes": 250})
    ["a saved plan's `predicted_peak_bytes` (250) must be within its `budget_bytes` (200)"]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_BYTES", "MAX_FLOPS", "MAX_SECONDS", "check_plan_data"]

MAX_BYTES = 10**18
"""The most bytes a saved plan may count (``budget_gb`` is at most 10^9 GB)."""
MAX_FLOPS = 10**24
"""The most forward FLOPs one saved item may cost (about a million GPU-hours at 300 TFLOP/s)."""
MAX_SECONDS = 86_400.0
"""The most seconds a saved plan may give one recompute or solve (a day)."""


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return _is_int(x) or isinstance(x, float)


def _in_range(least: float, most: float) -> Callable[[object], bool]:
    return lambda x: _is_int(x) and least <= x <= most


def _seconds(x: object) -> bool:
    return _is_number(x) and math.isfinite(x) and 0 <= x <= MAX_SECONDS


def _names(x: object) -> bool:
    return isinstance(x, (list, tuple)) and all(isinstance(name, str) and name for name in x)


def _notes(x: object) -> bool:
    return isinstance(x, (list, tuple)) and all(isinstance(note, str) for note in x)


def _op_calls(x: object) -> bool:
    return isinstance(x, (list, tuple)) and all(
        isinstance(call, (list, tuple))
        and len(call) == 2
        and isinstance(call[0], str)
        and bool(call[0])
        and _is_int(call[1])
        and call[1] >= 0
        for call in x
    )


_BYTES = (_in_range(0, MAX_BYTES), f"an integer number of bytes from 0 to {MAX_BYTES:.0e}")
_SECONDS = (_seconds, f"a finite number of seconds from 0 to {MAX_SECONDS:g}")
_NAME = (lambda x: isinstance(x, str) and bool(x), "a non-empty string")
_NAMES = (_names, "a list of non-empty strings")

ITEM_FIELDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "name": _NAME,
    "activation_bytes": _BYTES,
    "input_bytes": _BYTES,
    "recompute_seconds": _SECONDS,
    "flops": (_in_range(0, MAX_FLOPS), f"an integer number of FLOPs from 0 to {MAX_FLOPS:.0e}"),
    "keep_bytes": _BYTES,
    "option": (lambda x: isinstance(x, str), "a string (the option's name; empty at block level)"),
    "saved_ops": (_op_calls, "a list of [op name, occurrence >= 0] pairs"),
    "option_seconds": (lambda x: x is None or _seconds(x), "None or " + _SECONDS[1]),
    "option_flops": (lambda x: x is None or _in_range(0, MAX_FLOPS)(x), "None or an integer number of FLOPs"),
}
"""Per field of a saved `PlanItem`: the check, and what it allows (for the message)."""
ITEM_OPTIONAL = frozenset({"flops", "keep_bytes", "option", "saved_ops", "option_seconds", "option_flops"})

PLAN_FIELDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "checkpointed": _NAMES,
    "kept": _NAMES,
    "items": (lambda x: isinstance(x, (list, tuple)), "a list of items"),
    "static_bytes": _BYTES,
    "budget_bytes": (_in_range(1, MAX_BYTES), f"an integer number of bytes from 1 to {MAX_BYTES:.0e}"),
    "predicted_peak_bytes": _BYTES,
    "recompute_seconds": _SECONDS,
    "solver_method": _NAME,
    "solver_seconds": _SECONDS,
    "measured_peak_bytes": (lambda x: x is None or _BYTES[0](x), "None or " + _BYTES[1]),
    "replanned": (lambda x: isinstance(x, bool), "a bool"),
    "notes": (_notes, "a list of strings"),
}
"""Per field of a saved `CheckpointPlan`: the check, and what it allows (for the message)."""
PLAN_OPTIONAL = frozenset({"measured_peak_bytes", "replanned", "notes"})


def check_plan_data(data: Any) -> list[str]:
    """Every problem of a saved plan (a dict as ``CheckpointPlan.to_dict`` writes it), one line each.

    The fields first (present, known, of their type and range), then, when they are sound, how they
    agree with each other. An empty list: the data can be a plan.
    """
    problems = _field_problems(data, PLAN_FIELDS, PLAN_OPTIONAL, "a saved plan")
    if problems:
        return problems
    for index, item in enumerate(data["items"]):
        problems += _field_problems(item, ITEM_FIELDS, ITEM_OPTIONAL, f"a saved plan's `items[{index}]`")
    return problems or _consistency_problems(data)


def _field_problems(
    data: Any, checks: dict[str, tuple[Callable[[object], bool], str]], optional: frozenset[str], what: str
) -> list[str]:
    if not isinstance(data, dict):
        return [f"{what} must be a dict, got {type(data).__name__}"]
    required = set(checks) - optional
    missing, unknown = sorted(required - set(data)), sorted(map(str, set(data) - set(checks)))
    if missing or unknown:
        got = "; ".join(
            f"{what} {names}" for what, names in [("missing", missing), ("unknown", unknown)] if names
        )
        return [
            f"{what} must have the fields {sorted(required)} (and optionally {sorted(optional)}), got {got}"
        ]
    return [
        f"{what}'s `{name}` must be {allowed}, got {value!r:.80}"
        for name, value in data.items()
        for check, allowed in [checks[name]]
        if not check(value)
    ]


def _consistency_problems(plan: dict[str, Any]) -> list[str]:
    """How the fields of a plan (each sound alone) contradict each other."""
    problems = _name_problems(plan)
    static, budget, predicted = plan["static_bytes"], plan["budget_bytes"], plan["predicted_peak_bytes"]
    if predicted > budget:
        problems.append(
            f"a saved plan's `predicted_peak_bytes` ({predicted}) must be within its `budget_bytes` ({budget})"
        )
    if predicted < static:
        problems.append(
            f"a saved plan's `predicted_peak_bytes` ({predicted}) must be at least its `static_bytes` ({static})"
        )
    problems += _option_problems(plan)
    problems += _measured_problems(plan)
    if not problems:
        problems += _recompute_problems(plan)
    return problems


def _name_problems(plan: dict[str, Any]) -> list[str]:
    names = [item["name"] for item in plan["items"]]
    checkpointed, kept = list(plan["checkpointed"]), list(plan["kept"])
    if len(set(names)) != len(names):
        return [f"a saved plan's items must have distinct names, got {names!r:.80}"]
    if sorted(checkpointed + kept) != sorted(names):
        return [
            "a saved plan's `checkpointed` and `kept` must split its items' names, got"
            f" {checkpointed!r:.40} and {kept!r:.40} for {names!r:.40}"
        ]
    return []


def _measured_problems(plan: dict[str, Any]) -> list[str]:
    """A measured peak counts the static memory (parameters, gradients, optimizer state) too; over the
    budget it is only where the one re-plan already ran (the callback re-plans a plan measured over)."""
    measured, static, budget = plan.get("measured_peak_bytes"), plan["static_bytes"], plan["budget_bytes"]
    if measured is None:
        return []
    if measured < static // 2:
        return [
            f"a saved plan's `measured_peak_bytes` ({measured}) must be at least half its `static_bytes`"
            f" ({static}): a measured step holds the parameters, gradients and optimizer state"
        ]
    if measured > budget and not plan.get("replanned", False):
        return [
            f"a saved plan's `measured_peak_bytes` ({measured}) is over its `budget_bytes` ({budget}) but it"
            " is not `replanned` (the callback re-plans such a plan)"
        ]
    return []


def _option_problems(plan: dict[str, Any]) -> list[str]:
    """An op-level item's option agrees with the plan's lists: keep is kept; checkpoint and a selective
    option (one that saves op calls) are checkpointed; a selective option saves at least one call, each
    once. Whether the calls are the model's is checked on a resume, against its forward."""
    checkpointed = set(plan["checkpointed"])
    for item in plan["items"]:
        option, saved = item.get("option", ""), item.get("saved_ops", ())
        if not option and not saved:
            continue
        in_checkpointed = item["name"] in checkpointed
        if (option == "keep") == in_checkpointed or (option == "keep" and saved):
            return [
                f"a saved plan's item {item['name']!r} has option {option!r} but is"
                f" {'checkpointed' if in_checkpointed else 'kept'}"
            ]
        if option not in ("keep", "checkpoint") and not saved:
            return [
                f"a saved plan's item {item['name']!r} has the selective option {option!r} but no `saved_ops`"
            ]
        if len({tuple(call) for call in saved}) != len(saved):
            return [
                f"a saved plan's item {item['name']!r} names an op call twice in `saved_ops`: {saved!r:.80}"
            ]
    return []


def _item_seconds(item: dict[str, Any]) -> float:
    """What a checkpointed item recomputes: its option's time in an op-level plan, else its forward's."""
    seconds = item.get("option_seconds")
    return item["recompute_seconds"] if seconds is None else seconds


def _recompute_problems(plan: dict[str, Any]) -> list[str]:
    checkpointed = set(plan["checkpointed"])
    total = sum(_item_seconds(item) for item in plan["items"] if item["name"] in checkpointed)
    if not math.isclose(plan["recompute_seconds"], total, rel_tol=1e-9, abs_tol=1e-12):
        return [
            f"a saved plan's `recompute_seconds` ({plan['recompute_seconds']!r}) must be the sum over its"
            f" checkpointed items ({total!r})"
        ]
    return []
