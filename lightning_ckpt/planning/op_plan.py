"""From a step profile, each candidate's measured options and a budget to an op-level `CheckpointPlan`.

Each candidate gets keep (the block-level weight, no recompute), full checkpoint (the block-level skip
point, its whole recompute) and the selective options measured on it
(:func:`~lightning_ckpt.core.selective.costs.option_costs`): what each holds to its backward, its
backward's transient and its recompute, the step's own recompute time of the block scaling the option's
share, plus eager SAC's measured overhead. A selective option's forward extra over a full checkpoint's
counts at the candidate's checkpointed-forward point and its backward extra at its recomputation's
(:func:`split_skip_bases`): the step's points merge the two into one skip base, and both extras added to
it predicted uniform SDPA + all matmuls on the example GPT at 122.10 MB, 117.66 measured (+3.8%).
:func:`~lightning_ckpt.planning.choices.solve_options`
chooses one per candidate exactly; the plan's items carry each option's name and saved op calls. When
the step's points are not nested (no prefix form) the plan is the block-level one, with a note.

Example:
    >>> from lightning_ckpt.core.profile_types import ModuleProfile, StaticMemory, StepProfile
    >>> sizes = {"a": (30, 0.1), "b": (60, 0.3), "c": (20, 0.2)}  # activation bytes, recompute s
    >>> modules = tuple(ModuleProfile(name, size, 10, s, 0) for name, (size, s) in sizes.items())
    >>> profile = StepProfile(modules, StaticMemory("cpu", 100, 0, 0, 0), 5, 2)
    >>> plan = make_op_plan(profile, {}, 200)  # a hand-made profile's points are not nested
    >>> plan.checkpointed, plan.predicted_peak_bytes, plan.notes
    (('a', 'b'), 197, ('op level: the peak points are not nested; planned by block',))
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lightning_ckpt.config import AutoCheckpointConfig
from lightning_ckpt.core.profile_types import Cost, ModuleProfile, StepProfile
from lightning_ckpt.planning.choices import Option, Solve, choice_peak_bytes, solve_options
from lightning_ckpt.planning.errors import BudgetTooSmallError
from lightning_ckpt.planning.make import make_plan
from lightning_ckpt.planning.nested import PrefixForm, prefix_form
from lightning_ckpt.planning.peak import PeakModel
from lightning_ckpt.planning.plan import CheckpointPlan, PlanItem
from lightning_ckpt.planning.points import PeakPoint, peak_points

__all__ = [
    "SkipBases",
    "candidate_options",
    "choice_options",
    "make_op_plan",
    "op_form",
    "op_plan_peak_bytes",
    "split_skip_bases",
]

_DEFAULT_CONFIG = AutoCheckpointConfig(budget_gb=1.0, granularity="op")


SkipBases = tuple[float, float, float]
"""A candidate's skip base in the prefix form and the largest bases of the two kinds of points it
covers: its checkpointed forward's and its backward's (the recomputation's), each the skip base where
the profile has none apart (``-inf``: no point binds)."""


def candidate_options(
    module: ModuleProfile,
    weight_bytes: int,
    measured: Sequence[Any],
    cost: Cost,
    *,
    prune: bool = True,
    skip_bases: SkipBases | None = None,
) -> list[Option]:
    """Keep, full checkpoint and the measured selective options of one candidate.

    Args:
        module: the candidate's profile (its recompute seconds or FLOPs price the options).
        weight_bytes: what keeping it holds in the peak's prefix form.
        measured: its :class:`~lightning_ckpt.core.selective.costs.OptionCost` list (may be empty);
            keep's measured bytes, when below ``weight_bytes``, raise every selective option's by the
            difference (what the step holds that the block alone did not).
        cost: ``"time"`` or ``"flops"``.
        prune: leave out the selective options another option beats on every count.
        skip_bases: its :data:`SkipBases` (:func:`split_skip_bases`): a selective option's forward extra
            counts at its checkpointed forward's point and its backward extra at its recomputation's;
            None: both at the skip base (never less).
    """
    full = float(module.recompute_seconds if cost == "time" else module.flops)
    options = [
        Option("keep", "keep", int(weight_bytes), 0, 0.0),
        Option("checkpoint", "checkpoint", 0, 0, full),
    ]
    keep_measured = next((c.held_bytes for c in measured if c.kind == "keep"), weight_bytes)
    extra = max(0, int(weight_bytes) - int(keep_measured))
    timed = cost == "time"
    for c in measured:
        if c.kind != "selective":
            continue
        # in FLOPs, half a FLOP more: a tie with keep or checkpoint (SAC's own cost counts none) goes to them
        price = c.recompute_seconds(module.recompute_seconds) if timed else c.recompute_flops + 0.5
        options.append(
            Option(
                c.name,
                "selective",
                c.held_bytes + extra,
                c.transient_bytes,
                price,
                c.saved_ops,
                _skip_extra_bytes(c, skip_bases),
            )
        )
    return _undominated(options) if prune else options


def _skip_extra_bytes(c: Any, skip_bases: SkipBases | None) -> int:
    """What a selective option ``c`` adds over the skip base: its forward extra over its checkpointed
    forward's base and its backward extra over its recomputation's, whichever is higher."""
    extras = (int(c.forward_extra_bytes), int(c.backward_extra_bytes))
    if skip_bases is None or math.isinf(skip_bases[0]):
        return max(extras)
    skip, forward, backward = skip_bases
    return max(0, math.ceil(max(forward + extras[0], backward + extras[1]) - skip))


def split_skip_bases(profile: StepProfile, form: PrefixForm) -> list[SkipBases]:
    """Per candidate (profile order), its :data:`SkipBases` in ``form`` (the step's own nested points):
    the points counted only when it is checkpointed, its forward's and its backward's apart (the step's
    points merge them into the skip base, the larger one). Without storages (points from totals) both
    are the skip base.

    Example:
        >>> from lightning_ckpt.core.profile_types import ModuleProfile, StaticMemory, StepProfile
        >>> modules = (ModuleProfile("a", 30, 10, 0.1, 0),)
        >>> profile = StepProfile(modules, StaticMemory("cpu", 100, 0, 0, 0), 5, 2)
        >>> split_skip_bases(profile, PrefixForm((0,), (30,), (120.0,), (115.0,), 100.0))
        [(115.0, 115.0, 115.0)]
    """
    position = {candidate: k for k, candidate in enumerate(form.order)}
    forward = _checkpointed_bases(profile, forward=True)
    backward = _checkpointed_bases(profile, forward=False)
    bases = []
    for i in range(len(profile.modules)):
        skip = form.skip_base_bytes[position[i]] if i in position else -math.inf
        bases.append((skip, forward.get(i, skip), backward.get(i, skip)))
    return bases


def _checkpointed_bases(profile: StepProfile, *, forward: bool) -> dict[int, float]:
    """Candidate index -> the largest base of the points counted only when it is checkpointed, among the
    forward's points (``forward``) or the backward's."""
    if not profile.storages:
        return {}
    phases = tuple(p for p in profile.phases if bool(p.forward or p.if_checkpointed) == forward)
    bases: dict[int, float] = {}
    for point in peak_points(dataclasses.replace(profile, phases=phases)):
        if point.when is not None and not point.when[1]:
            bases[point.when[0]] = max(bases.get(point.when[0], -math.inf), float(point.base_bytes))
    return bases


def _undominated(options: list[Option]) -> list[Option]:
    """Keep and checkpoint, and the selective options no other option beats on held bytes, transient and
    cost at once (the solver would never take those)."""

    def beaten(o: Option) -> bool:
        return any(
            p is not o
            and p.held_bytes <= o.held_bytes
            and p.transient_bytes <= o.transient_bytes
            and p.cost <= o.cost
            and (p.held_bytes, p.transient_bytes, p.cost) != (o.held_bytes, o.transient_bytes, o.cost)
            for p in options
        )

    return [o for o in options if o.kind != "selective" or not beaten(o)]


def make_op_plan(
    profile: StepProfile,
    measured: Mapping[str, Sequence[Any]],
    budget_bytes: int,
    config: AutoCheckpointConfig | None = None,
    *,
    notes: Sequence[str] = (),
    solve: Solve | None = None,
) -> CheckpointPlan:
    """The op-level plan of least recompute whose predicted peak fits ``budget_bytes``.

    Args:
        profile: the step's profile.
        measured: candidate name -> its measured options (candidates left out get keep and checkpoint).
        budget_bytes: the budget to plan for.
        config: cost, quantum, solver method and workers.
        notes: lines added to the plan's report.
        solve: the multiple-choice solver (default ``lightning_ckpt.solver.solve_choices``).

    Raises:
        BudgetTooSmallError: if even checkpointing every candidate does not fit.
    """
    config = config or _DEFAULT_CONFIG
    peak = PeakModel(profile)
    form, bound_note = op_form(peak)
    if form is None:
        note = "op level: the peak points are not nested; planned by block"
        return make_plan(profile, budget_bytes, config, notes=(*notes, note), peak=peak)
    names = [m.name for m in profile.modules]
    fixed_bytes = peak.peak_bytes(names)
    if fixed_bytes > budget_bytes:
        raise BudgetTooSmallError(budget_bytes, fixed_bytes, len(names))
    options = choice_options(profile, form, measured, config.cost, exact=bound_note is None)
    start = time.perf_counter()
    everything = [0] * len(options)  # keep is option 0 of every candidate
    try:
        if choice_peak_bytes(form, options, everything) <= budget_bytes:
            choice, method = everything, "all-fit"
        else:
            choice, method = solve_options(
                form,
                options,
                int(budget_bytes),
                quantum_bytes=config.quantum_bytes,
                method=config.solver,
                workers=config.workers,
                solve=solve,
            )
    except ValueError:
        if bound_note is None:  # the exact form: fixed_bytes fit, so this is not a budget too small
            raise
        choice = None  # only the bound's extra bytes are over: the exact block-level plan fits
    solver_seconds = time.perf_counter() - start
    timed = config.cost == "time"
    if bound_note is not None:
        block = make_plan(profile, budget_bytes, config, notes=(*notes, bound_note), peak=peak)
        if choice is None or _block_cost(block, profile, config.cost) <= _choice_cost(options, choice):
            return block
        notes = (*notes, bound_note)
    return _plan(profile, form, options, choice, int(budget_bytes), method, solver_seconds, notes, timed)


def op_form(peak: PeakModel) -> tuple[PrefixForm | None, str | None]:
    """The prefix form op-level options are weighed in, and a note when it is an upper bound.

    The step's own points when they are nested. Otherwise a nested bound of them, when one exists: every
    storage held while any of some candidates is checkpointed (an input they share) counted as held
    always, and every candidate's weight at a point raised to its largest. It never predicts less than
    the points do; the note says by how much it may predict more.
    """
    form = prefix_form(peak.points, peak.matrix)
    if form is not None:
        return form, None
    keeps = [point.keep_bytes for point in peak.points]
    weights = np.max(np.stack(keeps), axis=0, initial=0) if keeps else np.zeros(0, dtype=np.int64)
    if any((keep < 0).any() for keep in keeps):
        return None, None
    bound = tuple(
        PeakPoint(
            int(point.base_bytes + sum(nbytes for _, nbytes in point.either_bytes)),
            np.where(point.keep_bytes != 0, weights, 0).astype(np.int64),
            when=point.when,
            time=point.time,
        )
        for point in peak.points
    )
    form = prefix_form(bound)
    if form is None:
        return None, None
    extra = max(_bound_extra(p, b) for p, b in zip(peak.points, bound, strict=True))
    return form, f"op level: planned on a nested bound of the peak points (at most {extra} B over them)"


def _bound_extra(point: PeakPoint, bound: PeakPoint) -> int:
    """The most ``bound`` may count over ``point`` (every candidate kept)."""
    return int(bound.base_bytes - point.base_bytes + (bound.keep_bytes - point.keep_bytes).sum())


def _choice_cost(options: list[list[Option]], choice: list[int]) -> float:
    return float(sum(options[i][j].cost for i, j in enumerate(choice)))


def _block_cost(plan: CheckpointPlan, profile: StepProfile, cost: Cost) -> float:
    chosen = set(plan.checkpointed)
    return float(
        sum(m.recompute_seconds if cost == "time" else m.flops for m in profile.modules if m.name in chosen)
    )


def choice_options(
    profile: StepProfile,
    form: PrefixForm,
    measured: Mapping[str, Sequence[Any]],
    cost: Cost,
    *,
    exact: bool = True,
    prune: bool = True,
) -> list[list[Option]]:
    """Each candidate's :func:`candidate_options` (profile order) as the planner weighs them in ``form``
    (``exact``: the step's own points, whose skip bases are split; else a bound of them, whose are not)."""
    weight = dict(zip(form.order, form.weight_bytes, strict=True))
    bases = split_skip_bases(profile, form) if exact else [None] * len(profile.modules)
    return [
        candidate_options(
            m, weight.get(i, 0), measured.get(m.name, ()), cost, prune=prune, skip_bases=bases[i]
        )
        for i, m in enumerate(profile.modules)
    ]


def op_plan_peak_bytes(
    profile: StepProfile, measured: Mapping[str, Sequence[Any]], plan: CheckpointPlan, cost: Cost = "time"
) -> int:
    """The predicted peak of ``plan`` (made from the same options on another rank's batch, say) on
    ``profile``, each candidate under the plan's option sized by ``measured``.

    An option of the plan this profile lacks (a candidate the step here did not call) counts as keep's
    bytes with the largest transient and extra of this candidate's options: never below any of them.

    Example:
        >>> from lightning_ckpt.core.profile_types import ModuleProfile, StaticMemory, StepProfile
        >>> modules = (ModuleProfile("a", 30, 10, 0.1, 0), ModuleProfile("b", 60, 10, 0.3, 0))
        >>> profile = StepProfile(modules, StaticMemory("cpu", 100, 0, 0, 0), 5, 2)
        >>> plan = make_op_plan(profile, {}, 200)
        >>> op_plan_peak_bytes(profile, {}, plan) == plan.predicted_peak_bytes
        True
    """
    peak = PeakModel(profile)
    form, bound_note = op_form(peak)
    if form is None or not plan.selective:
        return peak.peak_bytes(plan.checkpointed)
    options = choice_options(profile, form, measured, cost, exact=bound_note is None, prune=False)
    items = {item.name: item for item in plan.items}
    checkpointed = set(plan.checkpointed)
    choice = []
    for module, group in zip(profile.modules, options, strict=True):
        item = items.get(module.name)
        choice.append(_option_index(group, item, module.name in checkpointed))
    return choice_peak_bytes(form, options, choice)


def _option_index(group: list[Option], item: PlanItem | None, checkpointed: bool) -> int:
    """The index in ``group`` of ``item``'s option (appending a bound when ``group`` lacks it)."""
    if item is None or not item.saved_ops:
        return next(j for j, o in enumerate(group) if o.kind == ("checkpoint" if checkpointed else "keep"))
    for j, option in enumerate(group):
        if option.kind == "selective" and tuple(option.saved_ops) == tuple(item.saved_ops):
            return j
    transient = max(o.transient_bytes for o in group)
    extra = max(o.skip_extra_bytes for o in group)
    group.append(Option(item.option, "selective", group[0].held_bytes, transient, 0.0, item.saved_ops, extra))
    return len(group) - 1


def _plan(
    profile: StepProfile,
    form: PrefixForm,
    options: list[list[Option]],
    choice: list[int],
    budget_bytes: int,
    method: str,
    solver_seconds: float,
    notes: Sequence[str],
    timed: bool,
) -> CheckpointPlan:
    chosen = [options[i][j] for i, j in enumerate(choice)]
    items = tuple(
        _item(m, group, option, timed)
        for m, group, option in zip(profile.modules, options, chosen, strict=True)
    )
    predicted = choice_peak_bytes(form, options, choice)
    if predicted > budget_bytes:  # cannot happen by the solve's contract; never hand it out
        raise AssertionError(f"plan predicted at {predicted} bytes is over the budget {budget_bytes}")
    return CheckpointPlan(
        checkpointed=tuple(item.name for item in items if item.option != "keep"),
        kept=tuple(item.name for item in items if item.option == "keep"),
        items=items,
        static_bytes=int(profile.static_bytes),
        budget_bytes=budget_bytes,
        predicted_peak_bytes=predicted,
        recompute_seconds=float(sum(item.option_seconds for item in items if item.option != "keep")),
        solver_method=method,
        solver_seconds=solver_seconds,
        notes=tuple(str(note) for note in notes),
    )


def _item(module: ModuleProfile, group: list[Option], option: Option, timed: bool) -> PlanItem:
    flops = None if timed else int(option.cost)  # the FLOPs less the tie-break's half
    seconds = option.cost if timed else module.recompute_seconds * flops / max(module.flops, 1)
    return PlanItem(
        name=module.name,
        activation_bytes=int(module.activation_bytes),
        input_bytes=int(module.input_bytes),
        recompute_seconds=float(module.recompute_seconds),
        flops=int(module.flops),
        keep_bytes=int(group[0].held_bytes),
        option=option.name,
        saved_ops=tuple(option.saved_ops),
        option_seconds=float(seconds),
        option_flops=flops,
    )
