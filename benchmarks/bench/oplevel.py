"""``python -m benchmarks.bench.oplevel``: op-level plans against block-level, hand and uniform SAC
arrangements, side by side in one run (issue 24, item 5).

For each model (the example GPT at ``configs/gpt-cpu.yaml``'s sizes, and a 6-block GPT of n_embd 384),
the step is profiled once as the callback profiles it (a one-step Lightning fit) and one block's
options are measured once (:func:`~lightning_ckpt.core.selective.costs.option_costs`; the blocks are
alike; on the clock a fit uses, CPU time on a CPU). At 4 budgets between the least any plan reaches and the peak with nothing checkpointed it
plans the op level (``granularity="op"``) and the block level, and takes the best hand arrangement of
whole blocks (checkpoint the first, last or evenly spaced k blocks: the fewest predicted to fit, least
recompute first) and the uniform SAC policies (every block under SDPA only, SDPA + all matmuls, SDPA +
every other matmul). Every distinct arrangement is then run in a plain loop ordered as Lightning's
(forward, ``zero_grad``, backward, AdamW step): its measured peak (every live storage, as
``lightning_ckpt.testing.memory_cap`` counts) and its step time, median and IQR over ``--rounds``
interleaved rounds (the order rotating; ``--clock cpu``, the default, counts process CPU time, which a
shared machine disturbs less). Nothing is asserted; the table is what was measured, losses included.

Example:
    >>> hand_arrangements(["a", "b", "c"])[:3]
    [(), ('a',), ('c',)]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from examples.gpt import GPT
from lightning_ckpt import AutoCheckpoint
from lightning_ckpt.config import AutoCheckpointConfig
from lightning_ckpt.core.selective import apply_selective_checkpointing
from lightning_ckpt.core.selective.costs import OptionCost, option_costs
from lightning_ckpt.core.selective.measure import device_clock
from lightning_ckpt.core.selective.options import profile_block
from lightning_ckpt.core.selective.policy import SelectivePolicy
from lightning_ckpt.core.selective.timing import timed_option_times
from lightning_ckpt.core.wrapping import apply_checkpointing, remove_checkpointing
from lightning_ckpt.lightning.op_options import TIMED_ROUNDS
from lightning_ckpt.planning import make_plan
from lightning_ckpt.planning.choices import choice_peak_bytes
from lightning_ckpt.planning.nested import prefix_form
from lightning_ckpt.planning.op_plan import choice_options, make_op_plan
from lightning_ckpt.planning.peak import PeakModel
from lightning_ckpt.testing import memory_cap

__all__ = ["hand_arrangements", "main"]

CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}
UNIFORM = ("sdpa", "sdpa+matmuls", "sdpa+every other matmul")
FRACTIONS = (0.2, 0.4, 0.6, 0.8)
MODELS = {  # name: GPT sizes, batch size
    "example GPT (gpt-cpu.yaml)": (dict(block_size=128, n_layer=8, n_head=4, n_embd=128), 16),
    "6-block GPT n_embd 384": (dict(block_size=256, n_layer=6, n_head=6, n_embd=384), 8),
}

Arrangement = tuple[tuple[str, object], ...]
"""(block name, "checkpoint" or a SelectivePolicy) for each wrapped block; the others are kept."""


def hand_arrangements(names: list[str]) -> list[tuple[str, ...]]:
    """Whole-block arrangements by hand: the first, last or evenly spaced k blocks, k = 0..n."""
    found: list[tuple[str, ...]] = []
    n = len(names)
    for k in range(n + 1):
        spaced = [names[round(i * n / k)] for i in range(k)] if k else []
        for chosen in (names[:k], names[n - k :] if k else [], spaced):
            if tuple(chosen) not in found:
                found.append(tuple(chosen))
    return found


def _loader(config: dict, batch: int) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (4 * batch, config["block_size"] + 1), generator=generator)
    return DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=batch)


def _profile(config: dict, batch: int):
    """The step's profile as the callback makes it (one-step fit), and a fresh model."""
    probe = AutoCheckpoint(budget_gb=1000, measure=False)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[probe],
    )
    torch.manual_seed(0)
    trainer.fit(GPT(**config, dropout=0.0), train_dataloaders=_loader(config, batch))
    return probe.profile


def _block_costs(model: GPT, idx: torch.Tensor) -> list[OptionCost]:
    caught = {}
    handle = model.transformer.h[0].register_forward_pre_hook(lambda m, a: caught.setdefault("x", a[0]))
    with torch.no_grad():
        model(idx)
    handle.remove()
    x = caught["x"].detach().clone().requires_grad_(True)
    block, clock = model.transformer.h[0], device_clock(model)
    profile = profile_block(block, x, repeats=3, clock=clock, sac_overhead=False)  # as op_options._timed
    return option_costs(
        block, (x,), timed_option_times(block, x, profile=profile, repeats=TIMED_ROUNDS, clock=clock)
    )


def _predict(form, profile, costs: list[OptionCost], arrangement: dict) -> int:
    """The predicted peak of an arrangement (block name -> "checkpoint" or an OptionCost), with the
    planner's own options (:func:`choice_options`, unpruned: its held-bytes correction included)."""
    measured = dict.fromkeys((m.name for m in profile.modules), costs)
    options = choice_options(profile, form, measured, "flops", prune=False)
    choice = []
    for module, group in zip(profile.modules, options, strict=True):
        what = arrangement.get(module.name)
        name = "keep" if what is None else "checkpoint" if what == "checkpoint" else what.name
        choice.append(next(j for j, option in enumerate(group) if option.name == name))
    return choice_peak_bytes(form, options, choice)


def _apply(model: GPT, arrangement: Arrangement) -> None:
    remove_checkpointing(model)
    full = [name for name, what in arrangement if what == "checkpoint"]
    if full:
        apply_checkpointing(model, full)
    policies = {name: what for name, what in arrangement if isinstance(what, SelectivePolicy)}
    if policies:
        apply_selective_checkpointing(model, policies)


def _step(model: GPT, optimizer, idx, targets) -> None:
    loss = model(idx, targets)[1]  # the logits freed before backward, as Lightning's `training_step`
    optimizer.zero_grad(set_to_none=True)  # after the forward, as Lightning's loop
    loss.backward()
    optimizer.step()


def _measured_peak(model, optimizer, idx, targets, arrangement: Arrangement) -> int:
    _apply(model, arrangement)
    _step(model, optimizer, idx, targets)  # gradients and optimizer state exist from here on
    with memory_cap(10**15, model=model, optimizer=optimizer) as meter:
        _step(model, optimizer, idx, targets)
    return meter.peak_bytes


def _timed(model, optimizer, idx, targets, arrangements: list[Arrangement], rounds: int, clock) -> list:
    seconds: list[list[float]] = [[] for _ in arrangements]
    for r in range(rounds):
        order = list(range(len(arrangements)))
        order = order[r % len(order) :] + order[: r % len(order)]
        for k in order:
            _apply(model, arrangements[k])
            _step(model, optimizer, idx, targets)  # warm-up under this arrangement
            start = clock()
            _step(model, optimizer, idx, targets)
            seconds[k].append(clock() - start)
    remove_checkpointing(model)
    return seconds


def _rows(profile, costs: list[OptionCost], budgets: list[int]) -> list[tuple[int, str, dict]]:
    """(budget, arrangement's label, block name -> "checkpoint" / OptionCost) for every arrangement."""
    peak = PeakModel(profile)
    form = prefix_form(peak.points, peak.matrix)
    names = [m.name for m in profile.modules]
    by_name = {c.name: c for c in costs}
    config = AutoCheckpointConfig(budget_gb=1.0, granularity="op")
    measured = dict.fromkeys(names, costs)
    rows = []
    for budget in budgets:
        op = make_op_plan(profile, measured, budget, config)
        rows.append((budget, "op-level plan", _from_items(op, by_name)))
        block = make_plan(profile, budget, dataclasses.replace(config, granularity="block"))
        rows.append((budget, "block-level plan", dict.fromkeys(block.checkpointed, "checkpoint")))
        fitting = [h for h in hand_arrangements(names) if peak.peak_bytes(h) <= budget]
        if fitting:
            seconds = {m.name: m.recompute_seconds for m in profile.modules}
            best = min(fitting, key=lambda h: (len(h), sum(seconds[n] for n in h)))
            rows.append((budget, "best hand arrangement", dict.fromkeys(best, "checkpoint")))
        for rule in UNIFORM:
            if rule in by_name:
                rows.append((budget, f"uniform {rule}", dict.fromkeys(names, by_name[rule])))
    return [(b, label, a, _predict(form, profile, costs, a)) for b, label, a in rows]


def _from_items(plan, by_name: dict) -> dict:
    out = {}
    for item in plan.items:
        if item.option == "checkpoint":
            out[item.name] = "checkpoint"
        elif item.option not in ("keep", ""):
            out[item.name] = by_name[item.option]
    return out


def _key(arrangement: dict) -> Arrangement:
    return tuple(
        sorted(
            (n, w if w == "checkpoint" else SelectivePolicy(frozenset(w.saved_ops)))
            for n, w in arrangement.items()
        )
    )


def _label(arrangement: dict, n: int) -> str:
    counts: dict[str, int] = {}
    for what in arrangement.values():
        name = what if what == "checkpoint" else what.name
        counts[name] = counts.get(name, 0) + 1
    kept = n - sum(counts.values())
    parts = [f"{k} x {name}" for name, k in sorted(counts.items())] + ([f"{kept} x keep"] if kept else [])
    return " + ".join(parts)


def _iqr_ms(values: list[float]) -> str:
    if len(values) < 2:
        return "-"
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return f"{(q3 - q1) * 1e3:.1f}"


def bench_model(title: str, config: dict, batch: int, rounds: int, clock) -> None:
    profile = _profile(config, batch)
    torch.manual_seed(0)
    model = GPT(**config, dropout=0.0)
    optimizer = model.configure_optimizers()
    idx, targets = next(iter(_loader(config, batch)))
    costs = _block_costs(model, idx)
    peak = PeakModel(profile)
    low, high = peak.peak_bytes([m.name for m in profile.modules]), peak.peak_bytes([])
    budgets = [int(low + f * (high - low)) for f in FRACTIONS]
    rows = _rows(profile, costs, budgets)
    keys = list(dict.fromkeys(_key(a) for _, _, a, _ in rows))
    peaks = {key: _measured_peak(model, optimizer, idx, targets, key) for key in keys}
    times = dict(zip(keys, _timed(model, optimizer, idx, targets, keys, rounds, clock), strict=True))
    print(f"\n## {title}: {config}, batch {batch}; {len(keys)} distinct arrangements, {rounds} rounds")
    print("block 0's options (held MB, backward transient MB, recompute share, SAC overhead ms):")
    for c in costs:
        print(
            f"  {c.name}: {c.held_bytes / 1e6:.2f}, {c.transient_bytes / 1e6:.2f}, {c.recompute_share:.3f},"
            f" {'not measured' if c.overhead_seconds is None else f'{c.overhead_seconds * 1e3:.2f}'}"
        )
    print(
        "\n| budget MB | arrangement | blocks | predicted MB | measured MB | fits | step ms | IQR ms | / op-level |"
        "\n|---|---|---|---|---|---|---|---|---|"
    )
    n = len(profile.modules)
    for budget in budgets:
        mine = [r for r in rows if r[0] == budget]
        op_median = statistics.median(times[_key(mine[0][2])])
        for _, label, arrangement, predicted in mine:
            key = _key(arrangement)
            median = statistics.median(times[key])
            fits = "yes" if peaks[key] <= budget else "no"
            print(
                f"| {budget / 1e6:.1f} | {label} | {_label(arrangement, n)} | {predicted / 1e6:.2f} |"
                f" {peaks[key] / 1e6:.2f} | {fits} | {median * 1e3:.1f} | {_iqr_ms(times[key])} |"
                f" {median / op_median:.3f} |"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument("--only", choices=("example", "384"), default=None, help="one of the two models")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    for title, (config, batch) in MODELS.items():
        if args.only is None or args.only in title:
            bench_model(title, config, batch, args.rounds, CLOCKS[args.clock])


if __name__ == "__main__":
    main()
