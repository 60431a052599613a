"""Op-level plans: one option per candidate (keep, full checkpoint, or a selective policy), chosen
exactly under the nested peak (issue 24, item 3).

The nested points (:class:`~lightning_ckpt.planning.nested.PrefixForm`) say: with the candidates in
``order``, at candidate ``g``'s backward the step holds a base plus what the candidates before it hold;
after the last, the total base plus what every candidate holds. Block level, ``g`` holds its weight when
kept (its take base binds) and nothing when checkpointed (its skip base, the recompute included). An
option ``j`` of ``g`` generalises both: it holds ``held_bytes[j]`` from its forward to its backward, and
its own backward's base is the take base plus the option's measured ``transient_bytes``, never below the
skip base plus its measured extra over a full checkpoint (its forward holds its cache beside the
forward's temporaries, counted at the checkpointed forward's point; its recomputation runs inside the
kept block's backward, as a full one does). That is
a multiple-choice knapsack with prefix capacities: group ``g``'s option ``j`` weighs its held bytes and
may be taken while the groups before it weigh at most ``(budget - base[g][j]) // quantum``. Weights are
rounded up and rooms down to whole quanta, so a choice that fits in quanta fits in bytes; keep and
checkpoint alone are the 0/1 instance of the block-level planner.

Example:
    >>> form = PrefixForm((0, 1), (50, 50), (100.0, 90.0), (120.0, 110.0), 80.0)
    >>> options = [[Option("keep", "keep", 50, 0, 0.0), Option("sdpa", "selective", 20, 5, 0.5),
    ...             Option("checkpoint", "checkpoint", 0, 0, 1.0)]] * 2
    >>> instance = choice_instance(form, options, budget_bytes=170, quantum_bytes=1)
    >>> instance.weights, instance.values, instance.prefix_capacities
    (((50, 20, 0), (50, 20, 0)), ((1.0, 0.5, 0.0), (1.0, 0.5, 0.0)), ((70, 50, 50), (80, 60, 60)))
    >>> choice_peak_bytes(form, options, (1, 0))  # sdpa, then keep: 120 at 0's backward, 150 at the end
    150
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lightning_ckpt.planning.nested import PrefixForm

__all__ = [
    "ChoiceInstance",
    "Option",
    "choice_instance",
    "choice_peak_bytes",
    "option_bases",
    "solve_options",
]

OptionKind = Literal["keep", "checkpoint", "selective"]


@dataclass(frozen=True)
class Option:
    """One way to run a candidate, as the planner weighs it (plain data, no torch).

    Attributes:
        name: ``"keep"``, ``"checkpoint"`` or the selective rule's name.
        kind: ``"keep"``, ``"checkpoint"`` or ``"selective"``.
        held_bytes: held from its forward to its backward (keep: the block-level weight; checkpoint: 0).
        transient_bytes: what its own backward adds over the kept candidate's backward.
        cost: its recompute per step (seconds or FLOPs, as ``cost`` says; keep: 0).
        saved_ops: the op calls a selective option saves, ``(op name, occurrence)``.
        skip_extra_bytes: what a selective option adds over the full checkpoint's own points (the
            skip base): its forward's extra at the checkpointed forward's point and its backward's at the
            recomputation's, whichever binds higher (measured; ``op_plan.split_skip_bases``).
    """

    name: str
    kind: OptionKind
    held_bytes: int
    transient_bytes: int
    cost: float
    saved_ops: tuple[tuple[str, int], ...] = ()
    skip_extra_bytes: int = 0


@dataclass(frozen=True)
class ChoiceInstance:
    """The multiple-choice knapsack at one budget, in quanta (what ``solve_choices`` takes).

    Group ``k`` is the candidate ``groups[k]`` (profile order); its options are that candidate's options
    ``options[k]`` (indices into its list; those that cannot fit are left out), each with its weight,
    value (the recompute it saves against a full checkpoint) and prefix capacity.
    """

    groups: tuple[int, ...]
    options: tuple[tuple[int, ...], ...]
    weights: tuple[tuple[int, ...], ...]
    values: tuple[tuple[float, ...], ...]
    capacity: int
    prefix_capacities: tuple[tuple[int, ...], ...]


def option_bases(form: PrefixForm, position: int, options: Sequence[Option]) -> list[float]:
    """The base of each option's own backward point for the candidate at ``position`` of ``form.order``
    (``-inf``: nothing binds)."""
    take, skip = form.take_base_bytes[position], form.skip_base_bytes[position]
    bases = []
    for option in options:
        if option.kind == "keep":
            bases.append(take)
        elif option.kind == "checkpoint":
            bases.append(skip)
        else:
            bases.append(max(take + option.transient_bytes, skip + option.skip_extra_bytes))
    return bases


def choice_peak_bytes(form: PrefixForm, options: Sequence[Sequence[Option]], choice: Sequence[int]) -> int:
    """The predicted peak (bytes) when candidate ``i`` (profile order) takes ``options[i][choice[i]]``.

    With keep and checkpoint only it is the block-level peak (tested against
    :class:`~lightning_ckpt.planning.peak.PeakModel`).
    """
    peak, prefix = -math.inf, 0
    for position, candidate in enumerate(form.order):
        option = options[candidate][choice[candidate]]
        peak = max(peak, option_bases(form, position, [option])[0] + prefix)
        prefix += option.held_bytes
    return int(max(peak, form.total_base_bytes + prefix))


def _quanta(budget_bytes: int, base_bytes: float, quantum_bytes: int) -> float:
    return math.inf if base_bytes == -math.inf else (int(budget_bytes) - int(base_bytes)) // quantum_bytes


def choice_instance(
    form: PrefixForm, options: Sequence[Sequence[Option]], budget_bytes: int, quantum_bytes: int
) -> ChoiceInstance:
    """The instance at ``budget_bytes`` in quanta of ``quantum_bytes``.

    ``options[i]`` are candidate ``i``'s options (profile order), one of them of kind ``"checkpoint"``.
    An option is left out where it cannot fit or costs more than the full checkpoint.

    Raises:
        ValueError: when even checkpointing every candidate does not fit.
    """
    weights_q = [[-(-o.held_bytes // quantum_bytes) for o in group] for group in options]
    capacity = _quanta(budget_bytes, form.total_base_bytes, quantum_bytes)
    if capacity == math.inf:
        capacity = sum(max(group, default=0) for group in weights_q)
    if capacity < 0:
        raise ValueError("no choice of options fits the budget, not even checkpointing every candidate")
    kept, weights, values, caps = [], [], [], []
    for position, candidate in enumerate(form.order):
        group = options[candidate]
        full = _checkpoint_cost(group)
        rooms = [_quanta(budget_bytes, b, quantum_bytes) for b in option_bases(form, position, group)]
        chosen = [
            j
            for j, option in enumerate(group)
            if rooms[j] >= 0 and weights_q[candidate][j] <= capacity and option.cost <= full
        ]
        if not any(group[j].kind == "checkpoint" for j in chosen):
            raise ValueError("no choice of options fits the budget, not even checkpointing every candidate")
        kept.append(tuple(chosen))
        weights.append(tuple(weights_q[candidate][j] for j in chosen))
        values.append(tuple(float(full - group[j].cost) for j in chosen))
        caps.append(tuple(int(min(rooms[j], capacity)) for j in chosen))
    return ChoiceInstance(
        tuple(form.order), tuple(kept), tuple(weights), tuple(values), int(capacity), tuple(caps)
    )


def _checkpoint_cost(group: Sequence[Option]) -> float:
    costs = [option.cost for option in group if option.kind == "checkpoint"]
    if len(costs) != 1:
        raise ValueError(f"each candidate's options must hold one 'checkpoint' option, got {len(costs)}")
    return costs[0]


Solve = Callable[..., Any]
"""``solve_choices`` of :mod:`lightning_ckpt.solver` (or a stand-in with its contract, in tests)."""


def solve_options(
    form: PrefixForm,
    options: Sequence[Sequence[Option]],
    budget_bytes: int,
    *,
    quantum_bytes: int,
    method: str = "auto",
    workers: int = 1,
    solve: Solve | None = None,
) -> tuple[list[int], str]:
    """The option index of each candidate (profile order) of least recompute whose predicted peak fits
    ``budget_bytes``, and how it was solved.

    The exact solve in quanta, then a last pass that moves, best gain first, any candidate to a cheaper
    option that still fits in bytes (room the rounding left). Never over the budget.

    Raises:
        ValueError: when even checkpointing every candidate does not fit.
    """
    if solve is None:
        from lightning_ckpt.solver import solve_choices as solve
    instance = choice_instance(form, options, budget_bytes, quantum_bytes)
    result = solve(
        instance.weights,
        instance.values,
        instance.capacity,
        prefix_capacities=instance.prefix_capacities,
        method=method,
        workers=workers,
    )
    choice = [0] * len(options)
    for k, candidate in enumerate(instance.groups):
        choice[candidate] = instance.options[k][result.choice[k]]
    choice = _cheaper_that_fits(form, options, choice, budget_bytes)
    if choice_peak_bytes(form, options, choice) > budget_bytes:  # by the contract it cannot happen
        raise AssertionError("the chosen options' predicted peak is over the budget")
    return choice, f"{getattr(result, 'method', method)} (multiple choice, prefix capacities)"


def _cheaper_that_fits(
    form: PrefixForm, options: Sequence[Sequence[Option]], choice: list[int], budget_bytes: int
) -> list[int]:
    """``choice`` with each candidate, largest saving first, moved to a cheaper option where it fits."""
    choice = list(choice)
    moves = sorted(
        (
            (options[i][choice[i]].cost - option.cost, i, j)
            for i, group in enumerate(options)
            for j, option in enumerate(group)
        ),
        reverse=True,
    )
    for gain, i, j in moves:
        if gain <= 0 or options[i][j].cost >= options[i][choice[i]].cost:
            continue
        trial = choice[:i] + [j] + choice[i + 1 :]
        if choice_peak_bytes(form, options, trial) <= budget_bytes:
            choice = trial
    return choice
