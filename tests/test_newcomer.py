"""What a newcomer meets first: the README's Python example, `--version`, a fast `--help`, a bad config
value as one line, the log lines the README promises, and outputs under `runs/`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lightning_ckpt

ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str], cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess:
    """``python args`` in a fresh process, importing this checkout's package (not an installed one)."""
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    environment |= {"PYTHONPATH": str(ROOT)} | env
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=environment, capture_output=True, text=True, timeout=300
    )


def test_version_prints_the_package_version():
    done = _run(["-m", "lightning_ckpt.cli", "--version"])
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        f"lightning-ckpt {lightning_ckpt.__version__}\n",
        "",
    )
