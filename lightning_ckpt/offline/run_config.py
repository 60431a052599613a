"""Read a training run's LightningCLI YAML config without building anything (no model, no Trainer).

The offline planner and the sweep read the same config as ``python -m examples.train fit --config ...``:
it is parsed and validated by LightningCLI's own parser, so defaults, ``class_path`` resolution and
command-line overrides (``--trainer.devices 8``) mean exactly what they mean for training.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import yaml
from lightning.pytorch.cli import LightningCLI

from lightning_ckpt.lightning.run_spec import ClassSpec, RunConfig


class _ParseOnlyCLI(LightningCLI):
    """LightningCLI that parses and validates, but instantiates nothing."""

    def instantiate_classes(self) -> None:
        return None


def load_run_config(config_path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Parse a LightningCLI YAML config (plus ``--key value`` overrides) into a :class:`RunConfig`.

    Raises:
        ValueError: if the file does not exist, cannot be read, is empty or not a YAML mapping, or does not
            parse (LightningCLI needs ``model`` and ``data``); the message says which.
    """
    _check_yaml_file(Path(config_path))
    config = _parse(str(config_path), list(overrides or []))
    trainer = {key: _spec_or_value(value) for key, value in (config.get("trainer") or {}).items()}
    return RunConfig(
        model=_spec(config["model"]),
        data=_spec(config["data"]) if config.get("data") else None,
        trainer=trainer,
        autocheckpoint=_autocheckpoint_args(trainer.get("callbacks")),
    )


def _check_yaml_file(path: Path) -> None:
    """Refuse, with the reason, a config that is missing, unreadable, empty, not YAML or not a mapping."""
    if not path.is_file():
        raise ValueError(f"`config` must name an existing YAML file, got {str(path)!r}")
    try:
        with path.open() as handle:
            data = yaml.safe_load(handle)
    except OSError as error:
        raise ValueError(f"`config` {str(path)!r} cannot be read: {error.strerror}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        reason = " ".join(str(error).split())
        raise ValueError(f"`config` {str(path)!r} is not valid YAML: {reason}") from None
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise ValueError(
            f"`config` {str(path)!r} must be a YAML mapping with at least `model:` (and usually `data:` and"
            f" `trainer:`), got {got}"
        )


def _parse(config_path: str, overrides: list[str]) -> dict[str, Any]:
    """LightningCLI's parse of the config as plain data; its errors become ``ValueError`` (no exit)."""
    with warnings.catch_warnings():  # LightningCLI warns that sys.argv is not what it parses: intended
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        warnings.filterwarnings("ignore", message="No seed found")  # it still seeds (0): a line of noise
        try:
            cli = _ParseOnlyCLI(
                L.LightningModule,
                L.LightningDataModule,
                subclass_mode_model=True,
                subclass_mode_data=True,
                run=False,
                save_config_callback=None,
                args=["--config", config_path, *overrides],
                parser_kwargs={"exit_on_error": False},
            )
        except argparse.ArgumentError as error:
            reason = " ".join(str(error).split())  # one line
            raise ValueError(
                f"the config {config_path!r} (with overrides {overrides}) does not parse: {reason}"
            ) from None
    return cli.config.as_dict()


def _spec(entry: dict[str, Any]) -> ClassSpec:
    return ClassSpec(entry["class_path"], dict(entry.get("init_args") or {}))


def _spec_or_value(value: Any) -> Any:
    if isinstance(value, dict) and "class_path" in value:
        return _spec(value)
    if isinstance(value, list):
        return [_spec_or_value(item) for item in value]
    return value


def _autocheckpoint_args(callbacks: Any) -> dict[str, Any] | None:
    for callback in callbacks or []:
        if isinstance(callback, ClassSpec) and callback.class_path.endswith("AutoCheckpoint"):
            return dict(callback.init_args)
    return None
