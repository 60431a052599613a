"""Train the GPT example from a YAML config with LightningCLI.

Run from the repository root::

    python -m examples.train fit --config configs/gpt-cpu.yaml
    python -m examples.train fit --config configs/llama-hf-cpu.yaml

Any key can be overridden on the command line (``--trainer.max_steps 50``, ``--model.n_layer 2``);
``python -m examples.train fit --config configs/gpt-cpu.yaml --print_config`` shows the full config.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.cli import LightningCLI


def main(args: list[str] | None = None) -> LightningCLI:
    """Build the CLI from ``args`` (``sys.argv`` when ``None``) and run its subcommand.

    The config names its classes (``model: class_path: examples.gpt.GPT``), so any LightningModule and
    LightningDataModule can be swapped in (``configs/llama-hf-cpu.yaml`` trains a transformers Llama).
    """
    return LightningCLI(
        L.LightningModule,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        args=args,
    )


if __name__ == "__main__":
    main()
