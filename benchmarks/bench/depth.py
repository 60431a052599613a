"""``python -m benchmarks.bench.depth``: time and peak memory of offline planning against model depth.

For each number of blocks, a fresh process plans ``configs/gpt-cpu.yaml`` with ``n_layer`` blocks of tiny
width (``n_embd`` 8, one head, 16 tokens, batch 2) the way ``lightning-ckpt plan`` does: the model built
on fake tensors, one training step profiled on them (``profile_run_on_fake_tensors``), then the peak
points (``PeakModel``) and the plan (``make_plan``) at a budget halfway between the least any plan needs
and the peak with nothing checkpointed, so the solver runs. It prints, per depth, the seconds of each
part, the process's peak resident memory, the points and storages, and each column's ratio to the row
above (linear growth: the ratio of the depths).

Example::

    python -m benchmarks.bench.depth --blocks 10 100 1000 3000
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

__all__ = ["main", "plan_depth"]

CONFIG = "configs/gpt-cpu.yaml"
WIDTH = [
    "--model.init_args.n_embd",
    "8",
    "--model.init_args.n_head",
    "1",
    "--model.init_args.block_size",
    "16",
]
DATA = ["--data.init_args.batch_size", "2", "--data.init_args.block_size", "16"]


def plan_depth(num_blocks: int) -> dict[str, float]:
    """Plan the tiny-width GPT of ``num_blocks`` blocks offline in this process; its figures."""
    from lightning_ckpt.config import AutoCheckpointConfig
    from lightning_ckpt.lightning.fake_run import profile_run_on_fake_tensors
    from lightning_ckpt.offline.data import first_batch
    from lightning_ckpt.offline.run_config import load_run_config
    from lightning_ckpt.planning import make_plan
    from lightning_ckpt.planning.peak import PeakModel

    start = time.perf_counter()
    run = load_run_config(CONFIG, ["--model.init_args.n_layer", str(num_blocks), *WIDTH, *DATA])
    profile = profile_run_on_fake_tensors(run, None, first_batch(run.data)).profile
    profiled = time.perf_counter()
    peak = PeakModel(profile)
    names = [module.name for module in profile.modules]
    budget_bytes = (peak.peak_bytes(names) + peak.peak_bytes([])) // 2
    plan = make_plan(profile, budget_bytes, AutoCheckpointConfig(budget_gb=1.0, cost="flops"), peak=peak)
    planned = time.perf_counter()
    return {
        "blocks": num_blocks,
        "profile_s": profiled - start,
        "plan_s": planned - profiled,
        "points": len(peak.points),
        "storages": len(profile.storages),
        "checkpointed": len(plan.checkpointed),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _in_fresh_process(num_blocks: int) -> dict[str, float]:
    code = (
        "import json; from benchmarks.bench.depth import plan_depth;"
        " from lightning_ckpt.offline.stack import call_with_deep_stack;"
        f" print(json.dumps(call_with_deep_stack(plan_depth, {num_blocks})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(
            f"planning {num_blocks} blocks failed (exit status {done.returncode}):\n{done.stderr[-2000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


_COLUMNS = ("blocks", "profile_s", "plan_s", "peak_rss_mb", "points", "storages", "checkpointed")


def _row(figures: dict[str, float], previous: dict[str, float] | None) -> str:
    cells = []
    for column in _COLUMNS:
        value = figures[column]
        text = f"{value:.2f}" if isinstance(value, float) else str(value)
        if previous is not None and column != "checkpointed" and previous[column]:
            text += f" ({value / previous[column]:.1f}x)"
        cells.append(f"{text:>18}")
    return "".join(cells)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench.depth", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--blocks", type=int, nargs="+", default=[10, 100, 1000, 3000], help="depths to plan")
    args = parser.parse_args(argv)
    print("".join(f"{column:>18}" for column in _COLUMNS))
    previous = None
    for num_blocks in args.blocks:
        figures = _in_fresh_process(num_blocks)
        print(_row(figures, previous), flush=True)
        previous = figures


if __name__ == "__main__":
    main()
