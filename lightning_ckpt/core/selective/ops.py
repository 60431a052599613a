"""Record one block's forward op by op: what each op call outputs, what autograd saves of it, its cost.

:func:`record_ops` runs the block's forward (grad enabled, real tensors) under a dispatch mode and a pair
of saved-tensor hooks, a few times, and returns one :class:`OpCall` per aten op call, in order. A call is
named the way ``create_selective_checkpoint_contexts`` sees it: its ``OpOverload`` (``func``) and its
occurrence among the region's calls of that overload (``index``: the third ``aten.addmm.default`` is
index 2). Sizes are per storage, counted once (views share their base's); only storages the call
creates count (an in-place op or a view creates none).

Example:
    >>> import torch
    >>> block = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    >>> calls = record_ops(block, torch.randn(2, 4), repeats=1)
    >>> [(c.key, c.output_bytes, c.saved_bytes) for c in calls if c.output_bytes]  # (2, 8) float32 each
    [(('aten.addmm.default', 0), 64, 64), (('aten.gelu.default', 0), 64, 64)]
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn as nn
from torch.utils.checkpoint import SAC_IGNORED_OPS
from torch.utils.flop_counter import flop_registry, sdpa_flop_count

from lightning_ckpt._compat import FakeTensor, TorchDispatchMode, tree_leaves
from lightning_ckpt.core.fake_tensors import fake_model
from lightning_ckpt.core.storage import storage_key, storages_of

__all__ = ["OpCall", "on_fake_tensors", "record_ops"]


@dataclasses.dataclass(frozen=True)
class OpCall:
    """One aten op call of a block's forward.

    Attributes:
        func: the ``torch.ops.aten.*`` overload (what a selective-checkpoint policy receives).
        index: its occurrence among this block's calls of ``func`` (0 for the first).
        output_bytes: bytes of the storages it creates (what saving its output keeps alive), the block's
            own output left out (it lives on after the block anyway).
        saved_bytes: the part of ``output_bytes`` that autograd saves for backward when the block is kept.
        flops: its FLOPs as ``torch.utils.flop_counter`` counts them (0 for pointwise and copy ops).
        seconds: its measured time in the forward (median over the repeats; meaningless on fake tensors).
        random: it drew random numbers (an op tagged ``nondeterministic_seeded``, dropout's ``bernoulli_``
            or SDPA with dropout, that moved the RNG state; on fake tensors, one whose arguments do not
            turn it off).
        mutated: a later op writes into its output in place (saving it would cache a stale value).
        recomputed: a checkpointed recomputation runs it: torch's early stop ends the recomputation once
            the last tensor autograd saved is recomputed, so the calls after that one never run again.
    """

    func: Any
    index: int
    output_bytes: int
    saved_bytes: int
    flops: int
    seconds: float
    random: bool
    mutated: bool
    recomputed: bool

    @property
    def key(self) -> tuple[str, int]:
        """``(op name, occurrence)``, e.g. ``("aten.addmm.default", 2)``: the call's name in a policy."""
        return str(self.func), self.index

    @property
    def savable(self) -> bool:
        """Whether saving its output can pay: it creates memory, a recomputation would run it, it draws no
        random numbers (those are recomputed with the forward's RNG state) and nothing writes into its
        output afterwards."""
        return self.output_bytes > 0 and self.recomputed and not self.random and not self.mutated


def _is_random(func: Any) -> bool:
    """Whether the op may draw random numbers (SDPA may: it takes a dropout probability)."""
    return torch.Tag.nondeterministic_seeded in func.tags


def _drawless(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether a random op's arguments turn its randomness off (``dropout_p=0``, ``p=0``, ``train=False``)."""
    for position, argument in enumerate(func._schema.arguments):
        value = kwargs.get(argument.name, args[position] if position < len(args) else argument.default_value)
        if (argument.name in ("dropout_p", "p") and value == 0) or (
            argument.name == "train" and value is False
        ):
            return True
    return False


def _rng_states() -> list[torch.Tensor]:
    states = [torch.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states.append(torch.cuda.get_rng_state())
    return states


def _same(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    return len(before) == len(after) and all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def _written_args(func: Any, args: tuple, kwargs: dict) -> list[Any]:
    """The tensors an op writes into in place (``out=`` and ``self`` of ``add_``), by its schema."""
    written = []
    for position, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        if argument.name in kwargs:
            written.append(kwargs[argument.name])
        elif position < len(args) and not argument.kwarg_only:
            written.append(args[position])
    return written


def _flops(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs by ``torch.utils.flop_counter``'s formulas, and SDPA's for the CPU kernel it has none for."""
    if func is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default:
        return int(sdpa_flop_count(args[0].shape, args[1].shape, args[2].shape))
    counter = flop_registry.get(func.overloadpacket)
    return int(counter(*args, **kwargs, out_val=out)) if counter is not None else 0


class _Recorder(TorchDispatchMode):
    """Records every op call of one forward: its new storages, the ones it writes into, its time."""

    def __init__(self, clock: Callable[[], float], *, track: bool = True) -> None:
        super().__init__()
        self.clock = clock
        self.track = track
        self.calls: list[dict[str, Any]] = []
        self.keep_alive: list[torch.UntypedStorage] = []  # storage keys stay unique while recording
        self._counts: dict[Any, int] = defaultdict(int)
        self._creator: dict[int, int] = {}  # storage key -> index into calls
        self.output_keys: set[int] = set()  # the block output's storages, set after the forward
        self.reached = 0  # calls run when autograd packed its last tensor

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in SAC_IGNORED_OPS:
            return func(*args, **kwargs)
        if not self.track:  # timing only
            start = self.clock()
            out = func(*args, **kwargs)
            self.calls.append(dict(func=func, seconds=self.clock() - start))
            return out
        inputs = {storage_key(s) for t in tree_leaves((args, kwargs)) for s in storages_of(t)}
        fake = any(isinstance(t, FakeTensor) for t in tree_leaves((args, kwargs)))
        rng_before = _rng_states() if _is_random(func) and not fake else None
        start = self.clock()
        out = func(*args, **kwargs)
        seconds = self.clock() - start
        if fake:  # fake tensors draw nothing: read the op's own arguments instead
            random = _is_random(func) and not _drawless(func, args, kwargs)
        else:
            random = rng_before is not None and not _same(rng_before, _rng_states())
        for tensor in _written_args(func, args, kwargs):
            for storage in storages_of(tensor):
                if (creator := self._creator.get(storage_key(storage))) is not None:
                    self.calls[creator]["mutated"] = True
        new = {
            storage_key(s): s
            for t in tree_leaves(out)
            for s in storages_of(t)
            if storage_key(s) not in inputs
        }
        for key, storage in new.items():
            self._creator.setdefault(key, len(self.calls))
            self.keep_alive.append(storage)
        self.calls.append(
            dict(
                func=func,
                index=self._counts[func],
                storages=new,
                seconds=seconds,
                random=random,
                mutated=False,
            )
        )
        self._counts[func] += 1
        self.calls[-1]["flops"] = _flops(func, args, kwargs, out)
        return out


def _record_once(
    block: nn.Module, args: Sequence[Any], clock: Callable[[], float], *, track: bool = True
) -> tuple[_Recorder, set[int]]:
    """One forward under the recorder; returns it and the storage keys autograd packed for backward
    (``track=False``: the calls and their times only, no storage kept alive).

    ``recorder.reached`` is how many calls had run when autograd packed its last tensor (an input is
    packed before its op runs, an output after): a recomputation runs those and stops (torch's early stop).
    """
    packed: set[int] = set()

    def pack(tensor: torch.Tensor) -> None:
        packed.update(storage_key(s) for s in storages_of(tensor))
        recorder.reached = len(recorder.calls)
        # nothing is kept: no backward runs, and a saved output handed back as itself would tie its
        # node to itself (a cycle outside Python's collector: the run's saved tensors would never free)

    def unpack(_: None) -> torch.Tensor:
        raise RuntimeError("record_ops keeps no saved tensors: its forwards have no backward")

    recorder = _Recorder(clock, track=track)
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        with recorder:
            out = block(*args)
    recorder.output_keys = {storage_key(s) for t in tree_leaves(out) for s in storages_of(t)}
    return recorder, packed


def record_ops(
    block: nn.Module, *args: Any, repeats: int = 3, clock: Callable[[], float] = time.perf_counter
) -> list[OpCall]:
    """The op calls of ``block(*args)``'s forward, in order, with their bytes, FLOPs and median time.

    The forward runs once on a fake twin of the block (the sizes: nothing allocated; on fake tensors
    already, on them), then ``repeats + 1`` times for real with gradients enabled (as a recomputation
    runs): a warm-up, then the times, no storage kept past its run. It consumes random numbers (dropout); the
    caller restores the RNG state if that matters.

    Args:
        block: the module (its parameters may require gradients; no backward runs).
        *args: its positional inputs, real tensors.
        repeats: timed runs (at least 1).
        clock: seconds now: wall time by default; ``time.process_time`` (CPU time) on a shared CPU.

    Raises:
        ValueError: if ``repeats`` is below 1.
        RuntimeError: if the runs do not call the same ops in the same order.
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"`repeats` must be a positive integer, got {repeats!r}")
    if on_fake_tensors(block, args):
        first, packed = _record_once(block, args, clock)
    else:
        with fake_model(block) as fake:  # the sizes on a fake twin: nothing allocated
            first, packed = _record_once(block, fake.fake(args), clock)
        _record_once(block, args, clock, track=False)  # warm-up
    for call in first.calls:  # sizes only: the first run's storages are freed before the timed runs
        call["storages"] = {key: storage.nbytes() for key, storage in call["storages"].items()}
    first.keep_alive.clear()
    funcs = [c["func"] for c in first.calls]
    times = [[] for _ in first.calls]
    for _ in range(repeats):
        run = _record_once(block, args, clock, track=False)[0]
        if [c["func"] for c in run.calls] != funcs:
            raise RuntimeError(f"{type(block).__name__}'s forward called other ops on a second run")
        for column, call in zip(times, run.calls, strict=True):
            column.append(call["seconds"])
        del run  # one run's storages alive at a time
    medians = [statistics.median(column) for column in times]
    return [
        _op_call(call, packed, first.output_keys, s, position < first.reached)
        for position, (call, s) in enumerate(zip(first.calls, medians, strict=True))
    ]


def on_fake_tensors(block: nn.Module, args: Sequence[Any]) -> bool:
    """Whether ``block`` or its inputs are fake tensors already (a fake model: run it as it is)."""
    tensors = [*block.parameters(), *block.buffers(), *tree_leaves(args)]
    return any(isinstance(t, FakeTensor) for t in tensors)


def _op_call(
    call: dict[str, Any], packed: set[int], output_keys: set[int], seconds: float, recomputed: bool
) -> OpCall:
    """The record of one call; storages of the block's own output are left out (they live on anyway)."""
    storages = {key: s for key, s in call["storages"].items() if key not in output_keys}
    return OpCall(
        recomputed=recomputed,
        func=call["func"],
        index=call["index"],
        output_bytes=sum(storages.values()),
        saved_bytes=sum(nbytes for key, nbytes in storages.items() if key in packed),
        flops=call["flops"],
        seconds=seconds,
        random=call["random"],
        mutated=call["mutated"],
    )
