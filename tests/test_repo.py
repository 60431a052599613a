"""The README's two set-up commands and CI agree, and the configs they run exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README must open with a bash block of the two set-up commands"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_opens_with_exactly_two_commands():
    text = (ROOT / "README.md").read_text()
    assert text.index("```bash") < text.index("\n## "), "the commands come before any section"
    main_job, tests = readme_commands()
    assert "torch==2.13.0" in main_job and "configs/gpt-cpu.yaml" in main_job
    config = re.search(r"--config (\S+)", main_job).group(1)
    assert (ROOT / config).is_file()
    assert "torch==2.13.0" in tests and "pytest" in tests


def test_ci_installs_torch_first_and_runs_the_readme_test_command():
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in ci_lines if line and not line.startswith("#")]
    torch_line = next(
        i for i, line in enumerate(commands) if "pip install" in line and "torch==2.13.0" in line
    )
    test_line = commands.index(readme_commands()[1])
    assert torch_line < test_line
