"""``python -m benchmarks.bench.selective``: uniform per-block policies on a 6-block GPT, side by side.

The trunk of ``examples.gpt`` (6 blocks, n_embd 384, 6 heads, T=256, dropout 0) runs one training step
per policy, every block under the same policy: keep, full checkpoint, and the selective rules of
:mod:`lightning_ckpt.core.selective.options` (SDPA only, SDPA + all matmuls, SDPA + every other matmul,
torchtitan's rule), their saved calls taken from block 0's op record. For each it prints the measured
peak of the step (every storage the step creates, counted live: activations, recomputations,
gradients), the bytes the 6 blocks hold from forward to backward (predicted: block 0's option x 6, plus
the inputs of blocks 1-5; and measured), and the median step time (and its IQR) over ``--rounds``
rounds that run the policies round-robin, with its ratio to keep's and its extra time over keep's
beside the option's predicted recompute x 6, priced from the op record (shares plus SAC's overhead) and
timed whole as the callback prices it (:func:`~lightning_ckpt.core.selective.timing.timed_option_times`,
block 0's forward times its fraction); ``--clock cpu`` (the default) counts the process's CPU
time, which a shared machine disturbs less than wall time. It also prints block 0's options (its
frontier and the named rules) and eager SAC's own overhead per block, measured. Nothing is asserted:
on a shared CPU the times drift, the ratios within one run are what to read.

Example:
    >>> trunk, x = make_trunk(batch=1, seq_len=8, n_embd=32, n_head=2)
    >>> len(trunk.h), tuple(x.shape)
    (6, (1, 8))
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from examples.gpt import GPTConfig, Transformer
from lightning_ckpt.core.selective import (
    apply_selective_checkpointing,
    block_options,
    held_bytes,
    named_options,
)
from lightning_ckpt.core.selective import profile_block as profile_one_block
from lightning_ckpt.core.selective.options import BlockOption
from lightning_ckpt.core.selective.timing import timed_option_times
from lightning_ckpt.core.storage import LiveStorageTracker
from lightning_ckpt.core.wrapping import apply_checkpointing, remove_checkpointing

__all__ = ["POLICIES", "main", "make_trunk"]

Clock = Callable[[], float]
CLOCKS: dict[str, Clock] = {"cpu": time.process_time, "wall": time.perf_counter}

POLICIES = ("keep", "checkpoint", "sdpa", "sdpa+matmuls", "sdpa+every other matmul")
N_LAYER = 6


def make_trunk(batch: int, seq_len: int, n_embd: int, n_head: int) -> tuple[Transformer, torch.Tensor]:
    """The GPT trunk (no head) and a batch of token ids, seeded."""
    torch.manual_seed(0)
    config = GPTConfig(block_size=seq_len, n_layer=N_LAYER, n_head=n_head, n_embd=n_embd)
    return Transformer(config), torch.randint(0, config.vocab_size, (batch, seq_len))


def _apply(trunk: nn.Module, option: BlockOption) -> None:
    names = [f"h.{i}" for i in range(len(trunk.h))]
    if option.kind == "checkpoint":
        apply_checkpointing(trunk, names)
    elif option.kind == "selective":
        apply_selective_checkpointing(trunk, dict.fromkeys(names, option.policy))


def _step(trunk: nn.Module, idx: torch.Tensor) -> None:
    trunk(idx).square().mean().backward()
    trunk.zero_grad(set_to_none=True)


def _peak_bytes(trunk: nn.Module, idx: torch.Tensor) -> int:
    with LiveStorageTracker() as tracker:
        trunk(idx).square().mean().backward()
    trunk.zero_grad(set_to_none=True)
    return tracker.peak_bytes


def _held_by_blocks(trunk: nn.Module, idx: torch.Tensor) -> int:
    """Bytes the blocks hold for backward: the trunk's, less the embeddings' and final norm's."""
    with torch.no_grad():
        x = trunk.drop(trunk.wte(idx) + trunk.wpe(torch.arange(idx.shape[1])))
    x.requires_grad_(True)
    return held_bytes(nn.Sequential(*trunk.h), x)


def _timed(
    trunk: nn.Module, idx: torch.Tensor, options: dict[str, BlockOption], rounds: int, clock: Clock
) -> dict[str, list[float]]:
    """Each policy's step times, ``rounds`` of them, the policies run round-robin (the order rotating)."""
    seconds: dict[str, list[float]] = {name: [] for name in options}
    for r in range(rounds):
        order = list(options)[r % len(options) :] + list(options)[: r % len(options)]  # rotate
        for name in order:
            _apply(trunk, options[name])
            _step(trunk, idx)  # warm-up under this policy
            start = clock()
            _step(trunk, idx)
            seconds[name].append(clock() - start)
            remove_checkpointing(trunk)
    return seconds


def _iqr_ms(values: list[float]) -> str:
    if len(values) < 2:
        return "-"
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return f"{(q3 - q1) * 1e3:.1f}"


def _print_options(title: str, options: list[BlockOption]) -> None:
    print(
        f"\n{title}\n| option | kind | saved MB | recompute ms | recompute GFLOP | saved calls |\n|---|---|---|---|---|---|"
    )
    for o in options:
        calls = len(o.policy.saved) if o.policy else "-"
        print(
            f"| {o.name} | {o.kind} | {o.saved_bytes / 1e6:.2f} | {o.recompute_seconds * 1e3:.2f} | "
            f"{o.recompute_flops / 1e9:.3f} | {calls} |"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--n-embd", type=int, default=384)
    parser.add_argument("--n-head", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--clock", choices=sorted(CLOCKS), default="cpu", help="cpu: process CPU time (shared CPU)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    clock = CLOCKS[args.clock]
    trunk, idx = make_trunk(args.batch, args.seq_len, args.n_embd, args.n_head)
    with torch.no_grad():
        x = trunk.drop(trunk.wte(idx) + trunk.wpe(torch.arange(args.seq_len)))
    profile = profile_one_block(trunk.h[0], x.requires_grad_(True), repeats=5, clock=clock)
    named = named_options(profile)
    print(
        f"6-block GPT, n_embd {args.n_embd}, T={args.seq_len}, batch {args.batch}, {args.threads} thread(s), {args.clock} clock; "
        f"block 0: forward {profile.forward_seconds * 1e3:.2f} ms, {profile.forward_flops / 1e9:.3f} GFLOP, "
        f"eager SAC overhead {profile.sac_overhead_seconds * 1e3:.2f} ms per block (measured)"
    )
    _print_options("Block 0, its frontier:", block_options(profile))
    _print_options("Block 0, the named rules:", list(named.values()))
    options = {name: named[name] for name in POLICIES if name in named}
    timed = {
        o.name: o for o in timed_option_times(trunk.h[0], x, profile=profile, repeats=5, clock=clock).options
    }
    measured = {}
    for name, option in options.items():
        _apply(trunk, option)
        measured[name] = (_peak_bytes(trunk, idx), _held_by_blocks(trunk, idx))
        remove_checkpointing(trunk)
    times = _timed(trunk, idx, options, args.rounds, clock)
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"\nUniform policies, median of {args.rounds} round-robin rounds:")
    print(
        "| policy | peak MB | held MB predicted | held MB measured | step ms | IQR ms | time / keep's "
        "| extra ms predicted (op record) | extra ms predicted (timed) | extra ms measured |"
        "\n|---|---|---|---|---|---|---|---|---|---|"
    )
    inputs_bytes = (N_LAYER - 1) * x.nbytes  # blocks 1-5's inputs, made in the trunk, held by every policy
    for name, option in options.items():
        peak, held = measured[name]
        predicted = N_LAYER * option.saved_bytes + inputs_bytes
        print(
            f"| {name} | {peak / 1e6:.2f} | {predicted / 1e6:.2f} | {held / 1e6:.2f} | "
            f"{medians[name] * 1e3:.1f} | {_iqr_ms(times[name])} | {medians[name] / medians['keep']:.3f} | "
            f"{N_LAYER * option.recompute_seconds * 1e3:.1f} |"
            f" {N_LAYER * timed[name].recompute_seconds * 1e3 if name in timed else float('nan'):.1f} |"
            f" {(medians[name] - medians['keep']) * 1e3:.1f} |"
        )


if __name__ == "__main__":
    main()
