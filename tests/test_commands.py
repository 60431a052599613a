"""``lightning-ckpt plan|bench|sweep``: every user error is one line on stderr and a non-zero exit."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_ckpt import cli
from lightning_ckpt.offline import cli as plan_cli

CPU_CONFIG = "configs/gpt-cpu.yaml"


def _configs(folder: Path) -> dict[str, str]:
    bad_model = (
        "model:\n  class_path: examples.gpt.GPT\n  init_args: {n_embd: 33, n_head: 2}\n"
        "data:\n  class_path: examples.data.CharDataModule\n"
    )
    files = {
        "empty": "",
        "scalar": "hello\n",
        "broken": "model: [\n",
        "list": "- model\n",
        "bad_model": bad_model,
        "bad_budget": Path(CPU_CONFIG).read_text().replace("budget_gb: 0.12 ", 'budget_gb: "40GB"'),
        "negative_budget": Path(CPU_CONFIG).read_text().replace("budget_gb: 0.12 ", "budget_gb: -1 "),
        "no_target": Path(CPU_CONFIG).read_text().replace("targets: null ", "targets: [Nope] "),
    }
    for name, text in files.items():
        (folder / f"{name}.yaml").write_text(text)
    return {name: str(folder / f"{name}.yaml") for name in files}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["plan", "--config", "{missing}"],
            r"`config` must name an existing YAML file, got '.*missing.yaml'",
        ),
        (["plan", "--config", "{folder}"], r"`config` must name an existing YAML file"),
        (
            ["plan", "--config", "{empty}"],
            r"`config` '.*empty.yaml' must be a YAML mapping .* got an empty file",
        ),
        (["plan", "--config", "{scalar}"], r"must be a YAML mapping with at least `model:` .* got a str"),
        (["plan", "--config", "{list}"], r"must be a YAML mapping .* got a list"),
        (
            ["plan", "--config", "{broken}"],
            r"`config` '.*broken.yaml' is not valid YAML: .* line 2, column 1",
        ),
        (
            ["plan", "--config", CPU_CONFIG, "--json", "{missing_dir}/plan.json"],
            r"cannot write --json .*: its folder does not exist",
        ),
        (["plan", "--config", CPU_CONFIG, "--json", "{folder}"], r"cannot write --json '.*': it is a folder"),
        (
            ["bench", "--n", "10", "--json", "{missing_dir}/bench.json"],
            r"cannot write --json .*: its folder does not exist",
        ),
        (["bench", "--n", "10", "--plot", "{folder}"], r"cannot write --plot '.*': it is a folder"),
        (["plan", "--config", "{bad_model}", "--budget-gb", "1"], r"`n_embd` must be a multiple of `n_head`"),
        (  # AutoCheckpoint's own message, not jsonargparse's nested one
            ["plan", "--config", "{bad_budget}"],
            r"^lightning-ckpt plan: the config '.*bad_budget.yaml', trainer.callbacks\[1\] "
            r"\(lightning_ckpt.AutoCheckpoint\): `budget_gb` must be a positive finite .*, got '40GB'$",
        ),
        (["plan", "--config", "{negative_budget}"], r": `budget_gb` must be a positive finite .*, got -1.0$"),
        (
            ["plan", "--config", "{no_target}"],
            r": `targets` entry 'Nope' matches no module .* modules include",
        ),
        (
            ["sweep", "--config", "{empty}", "--out-dir", "{folder}"],
            r"must be a YAML mapping .* got an empty file",
        ),
        (
            [
                "sweep",
                "--config",
                CPU_CONFIG,
                "--out-dir",
                "{folder}/out",
                "--plot",
                "{missing_dir}/sweep.png",
            ],
            r"cannot write --plot .*: its folder does not exist",
        ),
    ],
)
def test_user_errors_are_one_line_and_a_non_zero_exit(tmp_path, capsys, argv, message):
    paths = _configs(tmp_path) | {
        "missing": str(tmp_path / "missing.yaml"),
        "folder": str(tmp_path),
        "missing_dir": str(tmp_path / "no" / "such"),
    }
    assert cli.main([arg.format(**paths) for arg in argv]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"lightning-ckpt {argv[0]}: ")
    assert re.search(message, lines[0]), lines[0]


def test_a_json_write_that_fails_at_the_end_is_one_line(tmp_path, capsys, monkeypatch):
    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "write_text", refuse)
    argv = [
        "--config",
        CPU_CONFIG,
        "--set",
        "model.init_args.n_layer=2",
        "--json",
        str(tmp_path / "plan.json"),
    ]
    assert plan_cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"lightning-ckpt plan: cannot write --json: PermissionError: [Errno 13] Permission denied: '{tmp_path / 'plan.json'}'"
    ]


def test_the_installed_command_prints_no_traceback(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "lightning_ckpt.cli", "plan", "--config", str(tmp_path / "empty.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "got an empty file" in done.stderr
