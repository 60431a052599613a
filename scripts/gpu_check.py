"""One-GPU check that AutoCheckpoint keeps a real bf16-mixed training run inside a tight budget.

Run once from the repository root on a single CUDA GPU (meant to take a few minutes on an H100/H200;
not yet timed on one)::

    python scripts/gpu_check.py [--json out.json]
    python scripts/gpu_check.py --fsdp2 [--json out.json]   # the same under FSDP2, world size 1
    python scripts/gpu_check.py --granularity op [--fsdp2] [--json out.json]   # op-level plans

What it does, on a GPT-2-medium-sized example GPT (24 blocks, 16 heads, width 1024, context 1024) with
random tokens:

1. Probe: for each batch shape of the run, profile one step with a huge budget (stopped right after
   planning, so nothing unchecked ever runs) and print the *minimum* budget (every block checkpointed)
   and the *unchecked* peak (nothing checkpointed) that the memory model predicts.
2. Budget: ``--budget-fraction`` (default 0.4) of the way from the largest minimum to the smallest
   unchecked peak over the shapes, so that every phase must checkpoint. The CUDA allocator is then capped
   at exactly that (``set_per_process_memory_fraction``): anything above it is an out-of-memory error.
3. Train with ``AutoCheckpoint(budget_gb=budget)``: ``--steps`` batches at sequence length
   ``--short-seq``, ``--steps`` at the full context, then ``--return-steps`` at the short length again, so
   a plan is made per new shape mid-fit and reused when a shape comes back.

``--fsdp2`` runs all of it under Lightning's ``ModelParallelStrategy`` with one data-parallel rank: the
example GPT's ``configure_model`` ``fully_shard``-s each block and then the model over a mesh of one GPU,
so FSDP2's hooks, gathers (of one shard) and reduce-scatters run for real, and the callback profiles its
sharded fake twin, as on a cluster.

How to read the table (one row per training step, printed as it runs):

- ``peak GB``: ``torch.cuda.max_memory_allocated`` over the whole step, reset when the step starts, so the
  first step of a shape includes its profiling and planning.
- ``predicted GB``: the predicted peak of the plan the step ran with; ``meas/pred`` the ratio of the two.
  Expect it close to 1, and lower on the fit's first step (no gradients or optimizer state exist yet,
  but the prediction counts them).
- ``budget GB``, ``ckpt`` (checkpointed blocks of the candidates), ``ms`` (step wall time) and ``note``
  (``plan``: first step of a new shape; ``re-plan``: the callback changed the plan after a measured step).

Exit status: 0 if every step ran and stayed at or under the budget; 1 on an out-of-memory error (the
step is named), a step over the budget, or a budget the callback refused; 2 if there is no CUDA GPU
(``--allow-cpu`` runs a tiny CPU smoke version instead, without memory figures) or the budget does not
fit on the GPU. Unless ``PYTORCH_ALLOC_CONF``/``PYTORCH_CUDA_ALLOC_CONF`` is set, the allocator uses
``expandable_segments:True`` to reduce fragmentation (not modelled, but capped with the rest).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if "PYTORCH_ALLOC_CONF" not in os.environ and "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:
    os.environ["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"  # before torch initialises CUDA

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from examples.gpt import GPT  # noqa: E402
from lightning_ckpt import AutoCheckpoint  # noqa: E402
from lightning_ckpt.planning import BudgetTooSmallError  # noqa: E402
from lightning_ckpt.planning.peak import fixed_peak_bytes, predict_peak_bytes  # noqa: E402

GB = 1e9
PROBE_BUDGET_GB = 1e6  # everything fits: the probe only wants the profile
GPU_DEFAULTS = dict(n_layer=24, n_head=16, n_embd=1024, block_size=1024, batch_size=16, steps=20)
CPU_DEFAULTS = dict(n_layer=2, n_head=2, n_embd=64, block_size=64, batch_size=4, steps=3)
HEADER = (
    f"{'step':>4}  {'batch':>10}  {'peak GB':>8}  {'predicted GB':>12}  {'meas/pred':>9}  "
    f"{'budget GB':>9}  {'ckpt':>7}  {'ms':>7}  note"
)

warnings.filterwarnings("ignore", ".*does not have many workers.*")


@dataclass
class Row:
    step: int
    shape: list[int]
    peak_bytes: int | None
    predicted_bytes: int
    ratio: float | None
    budget_bytes: int
    checkpointed: int
    candidates: int
    milliseconds: float
    note: str


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, help="steps per phase (GPU 20, CPU 3)")
    parser.add_argument("--return-steps", type=int, default=2, help="steps back at the short length")
    parser.add_argument("--budget-fraction", type=float, default=0.4, help="0 = the minimum, 1 = unchecked")
    parser.add_argument("--batch-size", type=int, help="sequences per batch (GPU 16, CPU 4)")
    parser.add_argument("--short-seq", type=int, help="sequence length of phase 1 (default block_size/2)")
    parser.add_argument("--n-layer", type=int, help="blocks (GPU 24, CPU 2)")
    parser.add_argument("--n-head", type=int, help="attention heads (GPU 16, CPU 2)")
    parser.add_argument("--n-embd", type=int, help="width (GPU 1024, CPU 64)")
    parser.add_argument("--block-size", type=int, help="context length (GPU 1024, CPU 64)")
    parser.add_argument("--precision", default="bf16-mixed", help="Lightning precision")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the figures and the table here")
    parser.add_argument("--allow-cpu", action="store_true", help="without CUDA: tiny CPU smoke run")
    parser.add_argument(
        "--fsdp2", action="store_true", help="train under ModelParallelStrategy (fully_shard), world size 1"
    )
    parser.add_argument(
        "--granularity", choices=("block", "op"), default="block", help="AutoCheckpoint's granularity"
    )
    args = parser.parse_args(argv)
    if not 0.0 <= args.budget_fraction < 1.0:
        parser.error(f"--budget-fraction must be in [0, 1), got {args.budget_fraction}")
    return args


def resolve(args: argparse.Namespace, cuda: bool) -> argparse.Namespace:
    """Fill the flags left unset with the GPU or CPU-smoke defaults."""
    for name, value in (GPU_DEFAULTS if cuda else CPU_DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.short_seq is None:
        args.short_seq = max(args.block_size // 2, 1)
    return args


def schedule(args: argparse.Namespace) -> list[int]:
    """The sequence length of every training step."""
    short, full = args.short_seq, args.block_size
    return [short] * args.steps + [full] * args.steps + [short] * args.return_steps


def make_batches(seq_lens: list[int], batch_size: int, vocab_size: int, seed: int) -> list:
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for seq_len in seq_lens:
        tokens = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=generator)
        batches.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return batches


def build_model(args: argparse.Namespace) -> GPT:
    torch.manual_seed(args.seed)
    return GPT(
        block_size=args.block_size,
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_embd=args.n_embd,
        dropout=0.0,
    )


def make_strategy(args: argparse.Namespace) -> Any:
    """``"auto"`` (one device), or with ``--fsdp2`` FSDP2 over one data-parallel rank.

    Example:
        >>> type(make_strategy(argparse.Namespace(fsdp2=True))).__name__, make_strategy(argparse.Namespace(fsdp2=False))
        ('ModelParallelStrategy', 'auto')
    """
    if not args.fsdp2:
        return "auto"
    from lightning.pytorch.strategies import ModelParallelStrategy

    return ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1)


def make_trainer(args: argparse.Namespace, callbacks: list[Callback], max_steps: int) -> L.Trainer:
    return L.Trainer(
        accelerator="gpu" if torch.cuda.is_available() else "cpu",
        devices=1,
        strategy=make_strategy(args),
        use_distributed_sampler=False,  # the schedule's order of shapes, under FSDP2 too
        precision=args.precision,
        max_steps=max_steps,
        max_epochs=1,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )


class _Planned(Exception):
    """Raised by the probe once the callback has planned: the step itself is not needed."""


class StopAfterPlanning(Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        raise _Planned


def probe(args: argparse.Namespace, seq_len: int) -> tuple[int, int]:
    """(minimum budget, unchecked peak) in bytes that the memory model predicts for one batch shape."""
    model = build_model(args)
    callback = AutoCheckpoint(budget_gb=PROBE_BUDGET_GB, measure=False)
    trainer = make_trainer(args, [callback, StopAfterPlanning()], max_steps=1)
    batches = make_batches([seq_len], args.batch_size, model.config.vocab_size, args.seed)
    try:
        trainer.fit(model, train_dataloaders=DataLoader(batches, batch_size=None))
    except _Planned:
        pass
    profile = callback.profile
    figures = fixed_peak_bytes(profile), predict_peak_bytes(profile, [])
    del model, trainer, callback, profile
    free_memory()
    return figures


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class CudaPeak:
    """The allocator's peak since :meth:`reset`, kept across the resets that AutoCheckpoint's meter makes.

    ``torch.cuda.reset_peak_memory_stats`` is wrapped while the run lasts: any other caller's reset first
    folds the peak so far into ours, so a step's peak also covers what came before such a reset.
    """

    def __init__(self) -> None:
        self.device = torch.device("cuda", torch.cuda.current_device())
        self._original = torch.cuda.reset_peak_memory_stats
        self._carried = 0
        torch.cuda.reset_peak_memory_stats = self._foreign_reset

    def _foreign_reset(self, device=None) -> None:
        self._carried = max(self._carried, torch.cuda.max_memory_allocated(device))
        self._original(device)

    def reset(self) -> None:
        torch.cuda.synchronize(self.device)
        self._original(self.device)
        self._carried = 0

    def read(self) -> int:
        torch.cuda.synchronize(self.device)
        return max(self._carried, torch.cuda.max_memory_allocated(self.device))

    def close(self) -> None:
        torch.cuda.reset_peak_memory_stats = self._original


class NoPeak:
    """Stand-in on the CPU: no allocator, no figure."""

    def reset(self) -> None:
        pass

    def read(self) -> None:
        return None

    def close(self) -> None:
        pass


class StepRecorder(Callback):
    """Resets the peak as each step starts (before AutoCheckpoint profiles) and records a row as it ends.

    Put it before AutoCheckpoint in the trainer's callbacks, so that it runs first at both hooks: the
    reset precedes any profiling, and the row names the plan the step ran with (before any re-plan).
    """

    def __init__(self, auto: AutoCheckpoint, meter, budget_bytes: int) -> None:
        self.auto, self.meter, self.budget_bytes = auto, meter, budget_bytes
        self.rows: list[Row] = []
        self.step: int | None = None
        self._seen: dict[tuple, tuple] = {}  # shape -> (predicted, checkpointed) of its last step
        self._started = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.step = len(self.rows)
        self.meter.reset()
        self._started = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        peak = self.meter.read()
        plan = self.auto.plan
        shape = tuple(batch[0].shape)
        decision = (plan.predicted_peak_bytes, plan.checkpointed)
        note = "plan" if shape not in self._seen else "re-plan" if self._seen[shape] != decision else ""
        self._seen[shape] = decision
        row = Row(
            step=self.step,
            shape=list(shape),
            peak_bytes=peak,
            predicted_bytes=plan.predicted_peak_bytes,
            ratio=None if peak is None else peak / plan.predicted_peak_bytes,
            budget_bytes=self.budget_bytes,
            checkpointed=len(plan.checkpointed),
            candidates=len(plan.items),
            milliseconds=(time.perf_counter() - self._started) * 1000,
            note=note,
        )
        self.rows.append(row)
        print(format_row(row), flush=True)


def gb(nbytes: int | None) -> str:
    return "n/a" if nbytes is None else f"{nbytes / GB:.4f}"


def format_row(row: Row) -> str:
    shape = "x".join(map(str, row.shape))
    ratio = "n/a" if row.ratio is None else f"{row.ratio:.3f}"
    ckpt = f"{row.checkpointed}/{row.candidates}"
    return (
        f"{row.step:>4}  {shape:>10}  {gb(row.peak_bytes):>8}  {gb(row.predicted_bytes):>12}  {ratio:>9}  "
        f"{gb(row.budget_bytes):>9}  {ckpt:>7}  {row.milliseconds:>7.0f}  {row.note}"
    )


def budget_range(figures: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """From the largest minimum to the smallest unchecked peak over the shapes, so that every shape must
    checkpoint; if those cross, the largest shape's own range.

    Example:
        >>> budget_range({512: (8, 15), 1024: (10, 25)})
        (10, 15)
    """
    low = max(minimum for minimum, _ in figures.values())
    high = min(unchecked for _, unchecked in figures.values())
    return (low, high) if high > low else figures[max(figures)]


def choose_budget(low: int, high: int, fraction: float) -> int:
    """``fraction`` of the way from ``low`` to ``high``, in whole kB, at least 1 kB above ``low``.

    Example:
        >>> choose_budget(10_000_000, 20_000_000, 0.4)
        14000000
    """
    budget = int(low + fraction * (high - low)) // 1000 * 1000
    return max(budget, (low // 1000 + 1) * 1000)


def train(args: argparse.Namespace, budget_bytes: int, report: dict) -> int:
    """Train the schedule under the budget; fill ``report`` and return the exit status."""
    cuda = torch.cuda.is_available()
    model = build_model(args)
    batches = make_batches(schedule(args), args.batch_size, model.config.vocab_size, args.seed + 1)
    meter = CudaPeak() if cuda else NoPeak()
    auto = AutoCheckpoint(budget_gb=budget_bytes / GB, granularity=args.granularity)
    recorder = StepRecorder(auto, meter, budget_bytes)
    trainer = make_trainer(args, [recorder, auto], max_steps=len(batches))
    if cuda:
        free_memory()
        torch.cuda.set_per_process_memory_fraction(budget_bytes / report["device_total_bytes"])
    print("\n" + HEADER, flush=True)
    status = 0
    try:
        trainer.fit(model, train_dataloaders=DataLoader(batches, batch_size=None))
    except torch.OutOfMemoryError as error:
        print(f"FAIL: out of memory at step {recorder.step} (budget {gb(budget_bytes)} GB): {error}")
        report["oom_step"] = recorder.step
        status = 1
    except BudgetTooSmallError as error:
        print(f"FAIL: AutoCheckpoint refused the budget at step {recorder.step}: {error}")
        report["error"] = str(error)
        status = 1
    finally:
        meter.close()
    report["rows"] = [asdict(row) for row in recorder.rows]
    return max(status, summarize(recorder.rows, budget_bytes, report))


def summarize(rows: list[Row], budget_bytes: int, report: dict) -> int:
    ratios = [row.ratio for row in rows if row.ratio is not None]
    over = [row.step for row in rows if row.peak_bytes is not None and row.peak_bytes > budget_bytes]
    report["max_ratio"] = max(ratios) if ratios else None
    report["over_budget_steps"] = over
    print(f"\nsteps run: {len(rows)}")
    print("max measured/predicted: " + ("n/a (no CUDA allocator)" if not ratios else f"{max(ratios):.3f}"))
    if not ratios:
        print("over the budget: not measured on the CPU")
    elif over:
        print(f"FAIL: {len(over)} step(s) over the budget of {gb(budget_bytes)} GB: {over}")
    else:
        print(f"no step over the budget of {gb(budget_bytes)} GB")
    return 1 if over else 0


def print_probe(figures: dict[int, tuple[int, int]], args: argparse.Namespace, budget_bytes: int) -> None:
    print(f"\n{'batch':>10}  {'minimum GB':>10}  {'unchecked GB':>12}")
    for seq_len, (minimum, unchecked) in figures.items():
        print(f"{f'{args.batch_size}x{seq_len}':>10}  {gb(minimum):>10}  {gb(unchecked):>12}")
    print(
        f"budget: {gb(budget_bytes)} GB, {args.budget_fraction:g} of the way from the largest minimum to the"
        " smallest unchecked peak"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        print("gpu_check: needs a CUDA GPU (pass --allow-cpu for a tiny CPU smoke run)", file=sys.stderr)
        return 2
    args = resolve(args, cuda)
    L.seed_everything(args.seed, verbose=False)
    total = torch.cuda.get_device_properties(0).total_memory if cuda else None
    device = torch.cuda.get_device_name(0) if cuda else "CPU (smoke run: no allocator figures)"
    strategy = "FSDP2 (ModelParallelStrategy, world size 1)" if args.fsdp2 else "one device"
    print(
        f"gpu_check on {device}; model {args.n_layer} layers x {args.n_embd} wide, {args.precision}, {strategy}"
    )
    if cuda:
        conf = os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
        print(f"allocator config: {conf}; memory {gb(total)} GB")
    figures = {seq_len: probe(args, seq_len) for seq_len in sorted({args.short_seq, args.block_size})}
    budget_bytes = choose_budget(*budget_range(figures), args.budget_fraction)
    print_probe(figures, args, budget_bytes)
    report = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "device": device,
        "device_total_bytes": total,
        "probe": {
            str(seq_len): {"minimum_bytes": m, "unchecked_bytes": u} for seq_len, (m, u) in figures.items()
        },
        "budget_bytes": budget_bytes,
        "oom_step": None,
    }
    if cuda and budget_bytes >= total:
        print(
            f"gpu_check: the budget {gb(budget_bytes)} GB does not fit this GPU ({gb(total)} GB); lower --batch-size"
        )
        status = 2
    else:
        status = train(args, budget_bytes, report)
    report["exit_status"] = status
    print("PASS" if status == 0 else f"exit status {status}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
