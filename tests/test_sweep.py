"""``lightning-ckpt sweep`` on a tiny GPT: its tables, plot and JSON, and the verdict logic."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest

from benchmarks.sweep import cli as sweep
from benchmarks.sweep.report import BudgetVerdict, format_verdicts, verdicts
from benchmarks.sweep.run import PolicyResult, default_budgets_gb, hand_policy_blocks

CPU_CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "gpt-cpu.yaml")
TINY_OVERRIDES = [
    "--model.init_args.n_layer=2",
    "--model.init_args.n_embd=32",
    "--model.init_args.block_size=32",
    "--data.init_args.block_size=32",
    "--data.init_args.batch_size=8",
    "--data.init_args.max_chars=20000",
    "--data.init_args.train_samples=64",
]


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, dict, Path]:
    out = tmp_path_factory.mktemp("sweep")
    argv = ["--config", CPU_CONFIG, "--steps", "1", "--rounds", "2", "--num-budgets", "2"]
    argv += ["--out-dir", str(out / "sweep"), "--plot", *TINY_OVERRIDES]  # files named after the config
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = sweep.main(argv)
    report = json.loads((out / "sweep" / "gpt-cpu.json").read_text())
    return status, stdout.getvalue(), report, out / "sweep" / "gpt-cpu.png"


def test_sweep_prints_both_tables_and_writes_a_png(tiny_sweep) -> None:
    status, stdout, report, png = tiny_sweep
    for text in ("policy", "none", "all", "every-other", "auto@", "best_hand", "time_ratio"):
        assert text in stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert status == (0 if all(v["passed"] for v in report["verdicts"]) else 1)


def test_sweep_memory_order_and_identical_losses(tiny_sweep) -> None:
    _, _, report, _ = tiny_sweep
    by_policy = {row["policy"]: row for row in report["results"]}
    peaks = [by_policy[name]["measured_peak_bytes"] for name in ("all", "every-other", "none")]
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1]
    assert [len(by_policy[name]["checkpointed"]) for name in ("none", "every-other", "all")] == [0, 1, 2]
    assert [len(row["step_seconds"]) for row in report["results"]] == [2] * 5  # 2 rounds x 1 step each
    losses = {row["final_loss"] for row in report["results"]}
    assert len(losses) == 1 and math.isfinite(losses.pop())  # checkpointing never changes the arithmetic


def test_autocheckpoint_stays_within_every_default_budget(tiny_sweep) -> None:
    _, _, report, _ = tiny_sweep
    autos = [row for row in report["results"] if row["budget_gb"] is not None]
    assert len(autos) == 2
    for row in autos:
        assert row["error"] is None
        assert row["measured_peak_bytes"] <= row["budget_gb"] * 1e9
    assert all(v["auto_fits"] for v in report["verdicts"])


def _result(policy: str, peak_bytes: int, seconds: float, budget_gb: float | None = None) -> PolicyResult:
    return PolicyResult(policy, budget_gb, measured_peak_bytes=peak_bytes, step_seconds=[seconds])


@pytest.mark.parametrize(
    ("auto", "best_hand", "ratio", "passed"),
    [
        (_result("auto", 150, 1.2, budget_gb=160e-9), "all", 1.2 / 1.5, True),  # none is over 160 B
        (_result("auto", 150, 1.6, budget_gb=160e-9), "all", 1.6 / 1.5, False),  # slower than `all`
        (_result("auto", 170, 1.0, budget_gb=160e-9), "all", 1.0 / 1.5, False),  # over its budget
        (_result("auto", 90, 1.0, budget_gb=90e-9), None, math.nan, True),  # no hand policy fits
    ],
)
def test_verdicts_pick_the_fastest_fitting_hand_policy(auto, best_hand, ratio, passed) -> None:
    hands = [_result("none", 200, 1.0), _result("all", 100, 1.5)]
    (verdict,) = verdicts([*hands, auto])
    assert verdict.best_hand == best_hand
    assert verdict.passed is passed
    assert math.isnan(ratio) if best_hand is None else verdict.time_ratio == pytest.approx(ratio)


def test_format_verdicts_names_a_miss() -> None:
    rows = [BudgetVerdict(1.0, auto_fits=False, best_hand="all", time_ratio=0.9)]
    assert "OVER BUDGET" in format_verdicts(rows)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(
        ValueError, match="`policy` must be one of \\['all', 'every-other', 'none'\\], got 'odd'"
    ):
        hand_policy_blocks("odd", ["h.0"])
    with pytest.raises(ValueError, match="`count` must be a positive integer, got 0"):
        default_budgets_gb(1, 2, 0)
    assert sweep.main(["--config", CPU_CONFIG, "--budgets-gb", "-1"]) == 2


def test_a_mistyped_flag_is_refused_not_taken_as_an_override(capsys):
    from benchmarks.sweep import cli as sweep

    assert sweep.main(["--config", "configs/gpt-cpu.yaml", "--trials", "4"]) == 2
    assert "unrecognized option '--trials'" in capsys.readouterr().err


def test_verdicts_compare_with_the_old_plan_at_the_same_budget() -> None:
    hands = [_result("none", 200, 1.0), _result("all", 100, 1.5)]
    auto = _result("auto@1.6e-07GB", 150, 1.2, budget_gb=160e-9)
    old = PolicyResult(
        "additive@1.6e-07GB", 160e-9, measured_peak_bytes=120, step_seconds=[1.5], solver="ilp"
    )
    (verdict,) = verdicts([*hands, auto, old])  # the old plan is not judged as AutoCheckpoint
    assert verdict.old_plan_ratio == pytest.approx(1.2 / 1.5)
    assert "0.800" in format_verdicts([verdict]) and "vs_old" in format_verdicts([verdict])
