"""``lightning-ckpt plan`` refuses ``granularity: op`` with one line naming it (issue 24): op-level
options are measured in a fit, on the device, which the offline run does not do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lightning_ckpt import plan_offline

ROOT = Path(__file__).resolve().parents[1]
CONFIG = (
    "model:\n  class_path: examples.gpt.GPT\n  init_args: {block_size: 8, n_layer: 2, n_head: 2, n_embd: 16}\n"
    "data:\n  class_path: examples.data.CharDataModule\n"
    "  init_args: {block_size: 8, batch_size: 2, max_chars: 1000}\n"
    "trainer:\n  callbacks:\n    - class_path: lightning_ckpt.AutoCheckpoint\n"
    "      init_args: {budget_gb: 1, granularity: op}\n"
)
MESSAGE = "`granularity` must be 'block' to plan offline"


def test_an_op_level_config_is_refused_offline(tmp_path):
    config = tmp_path / "op.yaml"
    config.write_text(CONFIG)
    with pytest.raises(ValueError, match=f"{MESSAGE} .* got 'op'$"):
        plan_offline(config)


def test_the_cli_says_it_in_one_line_and_exits_1(tmp_path):
    config = tmp_path / "op.yaml"
    config.write_text(CONFIG)
    cmd = [sys.executable, "-m", "lightning_ckpt.cli", "plan", "--config", str(config)]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 1 and MESSAGE in result.stderr, result.stderr[-2000:]
    assert len([line for line in result.stderr.splitlines() if MESSAGE in line]) == 1
