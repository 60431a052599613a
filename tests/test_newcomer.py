"""What a newcomer meets first: the README's Python example, `--version`, a fast `--help`, a bad config
value as one line, the log lines the README promises, and outputs under `runs/`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lightning_ckpt

ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str], *, pythonpath: bool = True) -> subprocess.CompletedProcess:
    """``python args`` from the checkout's root in a fresh process, importing this checkout's package.

    ``pythonpath=False`` leaves ``PYTHONPATH`` unset: ``python -c`` then finds the package (and only it
    and ``examples``) through ``''``, the working directory, as a newcomer's shell does.
    """
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    if pythonpath:
        environment["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300
    )


def test_version_prints_the_package_version():
    done = _run(["-m", "lightning_ckpt.cli", "--version"])
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        f"lightning-ckpt {lightning_ckpt.__version__}\n",
        "",
    )


HEAVY = {"torch", "lightning", "numba"}


@pytest.mark.parametrize("command", [[], ["plan"], ["bench"], ["sweep"]])
def test_help_imports_neither_torch_nor_lightning(command):
    """`--help` answers at once: the parsers are built without the modules that take seconds to import."""
    done = _run(["-X", "importtime", "-m", "lightning_ckpt.cli", *command, "--help"])
    assert done.returncode == 0 and "usage: lightning-ckpt" in done.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "lightning_ckpt" in imported and not imported & HEAVY, sorted(imported & HEAVY)


def test_sweep_files_go_under_runs_sweep_by_default(tmp_path, monkeypatch):
    from benchmarks.sweep.cli import _prepare_outputs
    from benchmarks.sweep.options import parse

    monkeypatch.chdir(tmp_path)
    args, _ = parse(["--config", "configs/gpt-cpu.yaml", "--plot"])
    assert _prepare_outputs(args) == [Path("runs/sweep/gpt-cpu.json"), Path("runs/sweep/gpt-cpu.png")]
    assert [path.name for path in tmp_path.iterdir()] == ["runs"] and (tmp_path / "runs/sweep").is_dir()
    args, _ = parse(["--config", "c.yaml", "--out-dir", "mine", "--json", "x.json", "--plot", "/tmp/p.png"])
    assert _prepare_outputs(args) == [Path("mine/x.json"), Path("/tmp/p.png")]


def test_the_readme_python_example_runs_from_the_repository_root():
    """jsonargparse reads the config from `configs/`, where `''` on sys.path does not find `examples/`."""
    code = (
        "import lightning_ckpt; print(lightning_ckpt.__file__); "
        'from lightning_ckpt import plan_offline; print(plan_offline("configs/gpt2-xl-fsdp.yaml", budget_gb=80))'
    )
    done = _run(["-c", code], pythonpath=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(
        str(ROOT / "lightning_ckpt")
    )  # this checkout's package, not an installed one
    assert "model      examples.gpt.GPT: 1,556,840,000 parameters" in done.stdout and "(fits)" in done.stdout


_TOLD = """
import torch, torch.nn as nn
from lightning_ckpt.core.candidates import find_candidates
from lightning_ckpt.core.hf_models import training_without_cache

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)

class LM(nn.Module):
    config = type("Config", (), {"use_cache": True})()

    def forward(self, x, use_cache=None):
        return use_cache

model = nn.Module()
model.h = nn.ModuleList([Block(), Block()])
find_candidates(model)
find_candidates(model)  # the callback looks at setup and again at each plan: said once
find_candidates(model, ["h.*", "Linear"])
lm = LM()
with training_without_cache(lm):
    assert lm(torch.ones(1)) is False
"""


def test_the_log_lines_the_readme_promises_show_at_the_default_level():
    done = _run(["-c", _TOLD])
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines.count("AutoCheckpoint candidates: the blocks of h (2 x Block)") == 1, lines
    assert "AutoCheckpoint candidate 'h.0.fc' dropped: its ancestor 'h.0' is a candidate too" in done.stderr
    assert "AutoCheckpoint: use_cache=False while LM trains" in done.stderr


def _bad_config(folder: Path, old: str, new: str) -> str:
    text = (ROOT / "configs" / "gpt-cpu.yaml").read_text()
    assert old in text
    (folder / "bad.yaml").write_text(text.replace(old, new))
    return str(folder / "bad.yaml")


TINY_RUN = [
    "--model.init_args.n_layer",
    "2",
    "--data.init_args.max_chars",
    "20000",
    "--trainer.max_steps",
    "1",
]
BUDGET_MESSAGE = r"`budget_gb` must be a positive finite number of GB up to 1e\+09, got "


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "budget_gb: 0.12 ",
            'budget_gb: "40GB"',
            rf".*bad.yaml, trainer.callbacks\[1\] .*{BUDGET_MESSAGE}'40GB'$",
        ),
        ("budget_gb: 0.12 ", "budget_gb: -1   ", rf"trainer.callbacks\[1\] .*{BUDGET_MESSAGE}-1.0$"),
        (
            "targets: null  ",
            "targets: [Nope]",
            r"`targets` entry 'Nope' matches no module .* modules include \[.*\]",
        ),
    ],
)
def test_a_bad_autocheckpoint_value_in_a_training_config_is_one_line(tmp_path, old, new, message):
    config = _bad_config(tmp_path, old, new)
    argv = ["-m", "examples.train", "fit", "--config", config, *TINY_RUN]
    done = _run([*argv, "--trainer.default_root_dir", str(tmp_path)])
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert re.fullmatch(f"examples.train: {message}", lines[-1]), lines[-1]
    if "targets" not in old:  # refused before anything is built: the only line
        assert len(lines) == 1, lines


def test_an_error_of_the_model_itself_keeps_its_traceback():
    from examples.train import main as train_main

    with pytest.raises(ValueError, match="`n_embd` must be a multiple of `n_head`"):
        train_main(
            ["fit", "--config", str(ROOT / "configs" / "gpt-cpu.yaml"), "--model.init_args.n_embd", "33"]
        )
