"""Train the GPT example from a YAML config with LightningCLI.

Run from the repository root::

    python -m examples.train fit --config configs/gpt-cpu.yaml
    python -m examples.train fit --config configs/llama-hf-cpu.yaml

Any key can be overridden on the command line (``--trainer.max_steps 50``, ``--model.n_layer 2``);
``python -m examples.train fit --config configs/gpt-cpu.yaml --print_config`` shows the full config.

A value AutoCheckpoint refuses (``budget_gb: "40GB"``, a negative budget, a ``targets`` entry that matches
no module) ends in one line on stderr that names the key, what is allowed and what was given, and exit
status 1; other errors are reported as LightningCLI reports them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import lightning as L
import yaml
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lightning_ckpt.cli import one_line, raised_by_lightning_ckpt
from lightning_ckpt.offline.run_config import check_autocheckpoint_values, read_config_yaml


class CLI(LightningCLI):
    """LightningCLI that checks AutoCheckpoint's arguments with AutoCheckpoint's own messages.

    A value the parser refuses (``"40GB"`` for a float) is checked again in the config files as
    AutoCheckpoint checks it; a value it takes (a negative budget) is checked before anything is built.
    """

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        for path in _config_files(sys.argv[1:] if args is None else args):
            read_config_yaml(Path(path))  # an alias bomb or `budget_gb: 0x10`: refused before the parser
        try:
            super().parse_arguments(parser, args)  # raises: built with exit_on_error=False
        except argparse.ArgumentError as error:
            if "AutoCheckpoint" in str(error):
                for path in _config_files(sys.argv[1:] if args is None else args):
                    data = yaml.safe_load(Path(path).read_text())
                    check_autocheckpoint_values(data if isinstance(data, dict) else {}, path)
            parser.exit_on_error = True
            parser.error(str(error))  # as LightningCLI reports it: usage, the error, status 2
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        check_autocheckpoint_values(config.as_dict())


def _config_files(args: list[str]) -> list[str]:
    """The files given with ``--config`` / ``-c`` (those that exist: the parser reports the others).

    Example:
        >>> _config_files(["fit", "-c", "pyproject.toml", "--config=missing.yaml", "--trainer.max_steps", "1"])
        ['pyproject.toml']
    """
    files = [arg.split("=", 1)[1] for arg in args if arg.startswith("--config=")]
    files += [value for flag, value in zip(args, args[1:], strict=False) if flag in ("-c", "--config")]
    return [path for path in files if Path(path).is_file()]


def main(args: list[str] | None = None) -> LightningCLI:
    """Build the CLI from ``args`` (``sys.argv`` when ``None``) and run its subcommand.

    The config names its classes (``model: class_path: examples.gpt.GPT``), so any LightningModule and
    LightningDataModule can be swapped in (``configs/llama-hf-cpu.yaml`` trains a transformers Llama).

    Raises:
        SystemExit: status 1 after one line on stderr for an error of lightning_ckpt's own (a bad
            AutoCheckpoint value, a ``targets`` entry matching nothing, a budget below the smallest that
            works); status 2 for a bad option or config value of anything else, as LightningCLI exits.
    """
    try:
        return CLI(
            L.LightningModule,
            L.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"exit_on_error": False},
            args=args,
        )
    except ValueError as error:
        if not raised_by_lightning_ckpt(error):
            raise  # the model's, the data's or a library's: its traceback is the useful part
        sys.stderr.write(f"examples.train: {one_line(error)}\n")
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
