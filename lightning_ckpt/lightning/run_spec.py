"""What planning a run needs to know of it, as plain data: its model and data classes with their
arguments, the trainer settings, AutoCheckpoint's arguments.

:func:`lightning_ckpt.offline.run_config.load_run_config` reads one from a YAML config; the FSDP twin
builds one from a live Trainer (:mod:`lightning_ckpt.lightning.fsdp_twin`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from lightning_ckpt._compat import convert_precision

__all__ = ["ClassSpec", "RunConfig", "importable_working_directory", "module_spec"]


@dataclass(frozen=True)
class ClassSpec:
    """A ``class_path`` and its ``init_args``, as written in a config."""

    class_path: str
    init_args: dict[str, Any] = field(default_factory=dict)

    def load_class(self) -> type:
        module_name, _, class_name = self.class_path.rpartition(".")
        return getattr(importlib.import_module(module_name), class_name)

    def instantiate(self) -> Any:
        """The object the config describes.

        Raises:
            ValueError: when the class refuses its ``init_args`` (its own error, named, for any type).
        """
        with importable_working_directory():
            cls = self.load_class()
        try:
            return cls(**self.init_args)
        except ValueError:
            raise
        except Exception as error:  # the config's values, refused by the user's class in its own way
            reason = " ".join(str(error).split())
            raise ValueError(
                f"{self.class_path}(**init_args) failed: {type(error).__name__}: {reason}"
            ) from error


def module_spec(pl_module: Any, cls: type | None = None) -> ClassSpec:
    """A LightningModule as a config would name it: its class (``cls``, default its own) and its saved
    hyperparameters, less the keys LightningCLI adds to them (``_class_path``, ``_instantiator``).

    Example:
        >>> from examples.gpt import GPT
        >>> model = GPT(n_layer=1, n_head=1, n_embd=8)
        >>> model.hparams["_class_path"] = "examples.gpt.GPT"  # as LightningCLI leaves it
        >>> spec = module_spec(model)
        >>> spec.class_path, spec.init_args["n_layer"], "_class_path" in spec.init_args
        ('examples.gpt.GPT', 1, False)
    """
    cls = cls or type(pl_module)
    init_args = {key: value for key, value in pl_module.hparams.items() if not key.startswith("_")}
    return ClassSpec(f"{cls.__module__}.{cls.__qualname__}", init_args)


@dataclass(frozen=True)
class RunConfig:
    """What planning needs from a run config: model, data, trainer settings and AutoCheckpoint's arguments."""

    model: ClassSpec
    data: ClassSpec | None
    trainer: dict[str, Any]
    autocheckpoint: dict[str, Any] | None

    @property
    def world_size(self) -> int:
        return self.devices_per_node * int(self.trainer.get("num_nodes") or 1)

    @property
    def devices_per_node(self) -> int:
        """Devices on each node (``"auto"`` and other non-numbers count as 1)."""
        devices = self.trainer.get("devices", 1)
        return len(devices) if isinstance(devices, (list, tuple)) else _int_or_one(devices)

    @property
    def precision(self) -> str:
        """Lightning's precision setting in its unified form: ``"32-true"``, ``"bf16-mixed"``, ...

        Example:
            >>> RunConfig(ClassSpec("m.M"), None, {"precision": 32}, None).precision
            '32-true'
        """
        return convert_precision(self.trainer.get("precision") or "32-true")

    @property
    def strategy_args(self) -> dict[str, Any]:
        """The strategy's ``init_args`` when it is given as a class (``{}`` for a name like ``"ddp"``)."""
        strategy = self.trainer.get("strategy")
        return dict(strategy.init_args) if isinstance(strategy, ClassSpec) else {}

    @property
    def strategy_name(self) -> str:
        """``"fsdp2"`` (``ModelParallelStrategy``), ``"fsdp"``, ``"ddp"`` or ``"single"`` (what static memory
        modelling needs to know)."""
        strategy = self.trainer.get("strategy") or "auto"
        name = (strategy.class_path if isinstance(strategy, ClassSpec) else str(strategy)).lower()
        if "modelparallel" in name:
            return "fsdp2"
        if "fsdp" in name:
            return "fsdp"
        return "ddp" if "ddp" in name or self.world_size > 1 else "single"


def _int_or_one(devices: Any) -> int:
    try:
        return max(int(devices), 1)
    except (TypeError, ValueError):
        return 1  # "auto" and friends: one device unless the command line says otherwise


@contextlib.contextmanager
def importable_working_directory() -> Iterator[None]:
    """Modules of the working directory importable, as ``lightning-ckpt`` and ``python -m`` make them.

    ``python -c`` and notebooks have ``''`` on ``sys.path``, but jsonargparse reads a config from the
    config's folder (``configs/``), where ``''`` no longer finds ``examples``; the absolute path does.
    """
    folder = os.getcwd()
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        yield
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)
