"""`scripts/model_sweep.py` builds every architecture it lists, each with one block per layer found as
AutoCheckpoint's candidates (the sweep itself trains them: a command, not a test), and prints a row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from callback_helpers import script_module

from lightning_ckpt import find_candidates

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "model_sweep.py"


def test_every_listed_architecture_builds_with_its_layers_as_candidates():
    pytest.importorskip("transformers")
    sweep = script_module("model_sweep")
    for family, names in sweep.FAMILIES.items():
        for name in names:  # an encoder-decoder: its encoder's 4 blocks and its decoder's 4
            assert len(find_candidates(sweep.model_of(name))) == (8 if family == "seq2seq" else 4), name


def test_an_unknown_architecture_is_refused_by_name():
    done = subprocess.run([sys.executable, str(SCRIPT), "Nope"], capture_output=True, text=True, timeout=120)
    assert (
        done.returncode == 2
        and "`models` must be architectures of" in done.stderr
        and "'Nope'" in done.stderr
    )


def test_a_row_per_architecture_with_the_counted_peak():
    pytest.importorskip("transformers")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "Llama"], capture_output=True, text=True, timeout=600, check=True
    )
    row = done.stdout.strip().splitlines()[-1]
    assert row.startswith("Llama ") and row.count(" ckpt ") == 2, done.stdout + done.stderr
