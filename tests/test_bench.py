"""The benchmark command and the instance generators (tiny grids; no timing asserts)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from benchmarks import bench
from benchmarks.bench import (
    KNOWN_FAMILIES,
    BenchOptions,
    BenchRow,
    KnapsackInstance,
    Target,
    child,
    cli,
    format_table,
    harness,
    main,
    make_instance,
    run_grid,
    run_jobs,
    runner,
    targets,
)

QUIET = BenchOptions(max_seconds=60.0, progress=False)


# ------------------------------------------------------------------------------------ instance families


@pytest.mark.parametrize("family", KNOWN_FAMILIES)
def test_instances_are_seeded_and_deterministic(family: str) -> None:
    first, again = make_instance(family, 50, 10_000, seed=3), make_instance(family, 50, 10_000, seed=3)
    other = make_instance(family, 50, 10_000, seed=4)
    assert np.array_equal(first.weights, again.weights) and np.array_equal(first.values, again.values)
    assert not np.array_equal(first.values, other.values)
    assert first.weights.dtype == np.int64 and first.values.dtype == np.float64
    assert (first.weights >= 1).all() and np.isfinite(first.values).all() and (first.values >= 0).all()


def test_family_a_is_paper_like() -> None:
    n, capacity = 400, 100_000
    instance = make_instance("A", n, capacity, seed=1)
    assert instance.weights.min() >= 1 and instance.weights.max() <= 4 * capacity // n
    ratios = instance.values / instance.weights
    assert ratios.min() >= 0.5 and ratios.max() <= 1.5
    assert 1.7 < instance.weights.sum() / capacity < 2.3  # mean weight 2W/n: about half the items fit


def test_families_u_and_w_are_uncorrelated_and_weakly_correlated() -> None:
    n, capacity = 400, 100_000
    top = 4 * capacity // n
    plain, weak = make_instance("U", n, capacity, seed=1), make_instance("W", n, capacity, seed=1)
    assert np.array_equal(plain.weights, weak.weights) and plain.weights.max() <= top
    assert plain.values.min() >= 1 and plain.values.max() <= top
    assert abs(np.corrcoef(plain.weights, plain.values)[0, 1]) < 0.2
    assert weak.values.min() >= 1 and np.abs(weak.values - weak.weights).max() <= top / 10 + 1


def test_auto_dense_is_auto_without_the_sparse_states() -> None:
    instance = make_instance("U", 60, 5_000, seed=2)
    calls = {
        m: child._prepare(m, instance.weights.tolist(), instance.values.tolist(), 5_000)
        for m in ("auto", "auto-dense")
    }
    assert calls["auto"]() == calls["auto-dense"]()
    assert child._OUR_CALLS["auto-dense"] == ("auto", 1, {"sparse_max_states": 0})


def test_family_b_is_strongly_correlated() -> None:
    n, capacity = 400, 100_000
    instance = make_instance("B", n, capacity, seed=1)
    assert instance.weights.max() <= 4 * capacity // n
    np.testing.assert_allclose(instance.values, instance.weights + capacity / (10 * n), rtol=1e-12)


def test_family_c_repeats_ten_item_types_per_layer() -> None:
    n, capacity = 95, 100_000
    instance = make_instance("C", n, capacity, seed=2)
    weights, values = instance.weights, instance.values
    assert len(weights) == n and len(set(weights[:10].tolist())) > 1
    assert weights.min() >= 1 and weights.max() <= 4 * capacity // n
    assert np.array_equal(weights[10:], weights[:-10])  # identical layers keep identical activations
    assert np.abs(values[10:] / values[:-10] - 1).max() < 0.03  # recompute times: 1% noise only
    assert not np.array_equal(values[10:], values[:-10])


def test_make_instance_rejects_an_unknown_family() -> None:
    with pytest.raises(ValueError, match=r"`family` must be one of .*'A', 'B', 'C'.*, got 'D'"):
        make_instance("D", 10, 100)


# --------------------------------------------------------------------------------------- the command


def test_main_runs_every_method_and_writes_plot_and_json(tmp_path, capsys) -> None:
    plot, data = tmp_path / "bench.png", tmp_path / "bench.json"
    methods = list(bench.METHODS)
    argv = ["--families", "C", "--n", "12", "--W", "60", "--methods", *methods]
    code = main([*argv, "--plot", str(plot), "--json", str(data), "--no-progress", "--max-seconds", "60"])
    assert code == 0
    table = capsys.readouterr().out
    lines = [line.split() for line in table.splitlines() if line and not line.startswith("#")]
    assert lines[0][:4] == ["family", "n", "W", "method"]
    assert sorted(line[3] for line in lines[1:]) == sorted(methods)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = json.loads(data.read_text())["rows"]
    assert len(rows) == len(methods) and all(row["status"] == "ok" for row in rows)
    ours_exact = [r for r in rows if r["method"] in ("hirschberg", "hirschberg-w2", "auto", "dp", "ilp")]
    assert all(r["feasible"] and r["gap"] == 0 for r in ours_exact)
    assert all(r["weight"] <= r["capacity"] for r in rows if r["feasible"])


def test_feasibility_column_flags_torch_capacity_leak() -> None:
    leak = KnapsackInstance("A", 3, 1, 0, np.array([1, 1, 1]), np.array([1.0, 1.0, 1.0]))
    report = run_jobs([(leak, ["hirschberg", "torch-sliding"])], QUIET)
    ours, theirs = report.rows
    assert (ours.status, ours.feasible, ours.weight, ours.value, ours.gap) == ("ok", True, 1, 1.0, 0.0)
    assert (theirs.status, theirs.feasible, theirs.weight, theirs.value) == ("ok", False, 2, 2.0)
    torch_line = next(line for line in format_table(report.rows).splitlines() if "torch-sliding" in line)
    assert "NO (+1)" in torch_line


def test_peak_memory_counts_torch_tables() -> None:
    instance = make_instance("B", 50, 400_000, seed=0)
    torch_dp, torch_sliding = run_jobs([(instance, ["torch-dp", "torch-sliding"])], QUIET).rows
    table_bytes = 51 * 400_001 * 4  # torch's float32 (n+1) x (W+1) table
    assert 0.95 * table_bytes < torch_dp.peak_bytes < 1.3 * table_bytes
    assert torch_sliding.peak_bytes < 0.2 * table_bytes  # four float32 profiles of W+1: 6.4 MB


def test_peak_memory_counts_numpy_arrays_in_process() -> None:
    result = child._timed_calls(lambda: np.ones(25_000_000)[:3].nonzero()[0], 0.0, 1)
    assert 0.95 * 200e6 < result["self_peak_bytes"] < 1.1 * 200e6
    assert result["chosen"] == [0, 1, 2] and result["repeats"] == 1


def test_process_tree_is_found_and_measured() -> None:
    code = "import sys; print('ready', flush=True); sys.stdin.read()"
    process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert process.stdout.readline() == b"ready\n"
        assert process.pid in runner._descendants(os.getpid())
        assert runner._pss_bytes([process.pid]) > 1e6
    finally:
        process.communicate(b"")


def test_runner_is_killed_at_its_time_limit() -> None:
    started = runner._Runner("torch-sliding", torch_threads=1)
    # torch alone takes longer to import than the time limit
    result = started.call(make_instance("A", 10, 100), kill_after_s=0.01)
    assert result["status"] == "timeout" and not started.alive()
    assert re.fullmatch(r"timeout: killed after 0 s \(\d+ CPU s\)", result["note"]), result["note"]


def test_cpu_time_counts_work_not_waiting() -> None:
    """Under load a call's wall time grows; its ``cpu_s`` counts only the CPU its process got."""

    def sleep_then_spin() -> list[int]:
        time.sleep(0.1)
        end = time.process_time() + 0.02
        while time.process_time() < end:
            pass
        return [0]

    result = child._timed_calls(sleep_then_spin, 0.0, 1)
    assert result["time_s"] >= 0.1 and 0.02 <= result["cpu_s"] < result["time_s"] - 0.05


def test_skip_rules_refuse_large_tables_and_skip_slow_runs_without_running_them() -> None:
    options = BenchOptions(max_seconds=1e-12, max_memory_gb=4.0, progress=False)
    report = run_grid(["B"], [10], [100], ["torch-dp", "torch-sliding", "ilp"], options=options, paper=True)
    rows = {(r.capacity, r.method): r for r in report.rows}
    assert sorted({r.capacity for r in report.rows}) == [100, 140_000_000, 380_000_000]
    assert {r.n for r in report.rows if r.capacity > 100} == {2000}
    slow = rows[100, "torch-sliding"]
    assert slow.status == "skipped" and slow.note.startswith("skipped (est.") and slow.estimated_time_s > 0
    refused = rows[140_000_000, "torch-dp"]
    assert refused.status == "refused" and refused.note == "refused: table needs 1.12e+03 GB > 4 GB"
    assert (100, "ilp") in rows and rows[140_000_000, "ilp"].status == "skipped"  # HiGHS at paper sizes too
    assert report.first_call_s == {}  # no runner was started


def test_score_fills_gap_speedup_and_rate() -> None:
    instance = make_instance("A", 10, 1000)
    rows = [
        BenchRow("A", 10, 1000, "hirschberg", "ok", time_s=0.5, value=10.0, feasible=True),
        BenchRow("A", 10, 1000, "greedy", "ok", time_s=0.1, value=9.0, feasible=True),
        BenchRow("A", 10, 1000, "torch-sliding", "ok", time_s=2.0, value=11.0, feasible=False),
    ]
    harness._score(rows, instance)
    assert [r.gap for r in rows] == [0.0, pytest.approx(0.1), pytest.approx(-0.1)]
    assert [r.speedup_vs_torch for r in rows] == [4.0, 20.0, 1.0]
    assert rows[0].gcells_per_s == pytest.approx(10 * 1000 / 0.5 / 1e9) and rows[1].gcells_per_s is None


def test_verdicts_pass_and_miss() -> None:
    rows = [
        BenchRow("A", 10, 100, "auto", "ok", time_s=0.1, value=5.0, feasible=True, gap=0.0, peak_bytes=4000),
        BenchRow("A", 10, 100, "torch-sliding", "ok", time_s=1.0, value=5.0, feasible=True, gap=0.0),
    ]
    passed = targets._verdict(Target("speed", "A", 10, 100, "auto", "torch-sliding", 5.0), rows)
    missed = targets._verdict(
        Target("t", "A", 10, 100, "auto", "torch-sliding", 20.0, max_peak_bytes_per_unit=32), rows
    )
    assert passed["passed"] and "ratio 10x" in passed["measured"]
    assert passed["target"] == "speed: A n=10 W=100 auto >= 5x torch-sliding"
    assert not missed["passed"] and missed["misses"] == ["ratio 10x < 20x", "peak 40 B/unit > 32"]


def test_main_rejects_unknown_names(capsys) -> None:
    assert main(["--methods", "hirschberg", "simplex"]) == 2
    assert "--methods must be among hirschberg" in capsys.readouterr().err


def test_verdict_says_when_the_optimum_was_not_cross_checked() -> None:
    row = BenchRow("B", 10, 100, "hirschberg-w2", "ok", time_s=2.0, value=5.0, feasible=True, gap=0.0)
    row.gcells_per_s = 10 * 100 / 2.0 / 1e9
    verdict = targets._verdict(Target("speed", "B", 10, 100, "hirschberg-w2", min_gcells_per_s=3.0), [row])
    assert "optimum not cross-checked" in verdict["measured"]
    assert verdict["misses"] == ["5e-07 Gcell/s < 3"]


def test_prefix_family_side_by_side_with_additive_and_brute_force() -> None:
    from benchmarks.bench.prefix import PREFIX_METHODS, format_prefix, make_prefix_instance, run_prefix

    instance = make_prefix_instance(12, 5000, seed=3)
    assert (instance.skip <= instance.take).all() and instance.weights.max() <= 5000 // 4
    rows = run_prefix([12], [5000], PREFIX_METHODS, seed=3, max_seconds=60)
    by_method = {row["method"]: row for row in rows}
    assert all(row["status"] == "ok" and row["fits"] for row in rows)
    assert by_method["prefix"]["gap_vs_brute"] == pytest.approx(0.0, abs=1e-12)
    assert by_method["prefix-w2"]["value"] == by_method["prefix"]["value"]
    assert by_method["prefix"]["value_vs_additive"] >= 1.0
    assert "value/add" in format_prefix(rows)


def test_paper_flag_means_the_papers_instances_against_torch_and_highs() -> None:
    from benchmarks.bench import cli

    parser = cli._parser()
    for argv, families, methods in (
        (["--paper"], ["U", "W", "B", "C"], list(cli.PAPER_METHODS)),
        (["--paper", "--families", "A", "--methods", "auto"], ["A"], ["auto"]),
        (["--paper", "--quick"], ["U", "W", "B", "C"], ["auto", "ilp"]),
        ([], ["A", "B", "C"], [m for m in cli.METHODS if m != "auto-dense"]),
    ):
        args = parser.parse_args(argv)
        cli._check_names(parser, args)
        assert (args.families, args.methods) == (families, methods)
    assert {"auto", "hirschberg", "ilp", "torch-sliding", "torch-dp"} <= set(cli.PAPER_METHODS)


def test_timeout_s_sets_the_kill_limit_apart_from_the_skip_rule() -> None:
    """``--timeout-s``: PyTorch's solvers at paper scale run (estimates under ``--max-seconds``) and are
    killed at the limit given, not at 3x ``--max-seconds``."""
    assert cli._parser().parse_args(["--timeout-s", "180"]).timeout_s == 180.0
    assert harness._Bench(BenchOptions(max_seconds=2000, timeout_s=180), 1).kill_after_s == 180
    assert harness._Bench(BenchOptions(max_seconds=2), 1).kill_after_s == 10.0  # max(3 x, 10 s)
