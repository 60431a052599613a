"""Read a training run's LightningCLI YAML config without building anything (no model, no Trainer).

The offline planner and the sweep read the same config as ``python -m examples.train fit --config ...``:
it is parsed and validated by LightningCLI's own parser, so defaults, ``class_path`` resolution and
command-line overrides (``--trainer.devices 8``) mean exactly what they mean for training. Class paths
resolve from the working directory too (``examples.gpt.GPT`` from a checkout), as for ``python -m``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import yaml
from lightning.pytorch.cli import LightningCLI

from lightning_ckpt.config import AutoCheckpointConfig
from lightning_ckpt.lightning.run_spec import ClassSpec, RunConfig, importable_working_directory

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_NODES",
    "check_autocheckpoint_values",
    "load_run_config",
    "read_config_yaml",
]

MAX_CONFIG_BYTES = 10_000_000
"""The largest config file read (a training config is a few kB)."""
MAX_CONFIG_NODES = 100_000
"""The most YAML nodes a config may expand to, each alias counted as what it repeats (a training config
has hundreds): a "billion laughs" file is refused before anything expands it."""
_NUMERIC_ARGS = ("budget_gb", "quantum_bytes", "workers")
_DECIMAL = re.compile(r"[+-]?(0|[1-9][0-9]*)(\.[0-9]*)?([eE][+-]?[0-9]+)?|[+-]?\.[0-9]+([eE][+-]?[0-9]+)?")


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
    data = read_config_yaml(Path(config_path))
    config = _parse(str(config_path), list(overrides or []), data)
    trainer = {key: _spec_or_value(value) for key, value in (config.get("trainer") or {}).items()}
    return RunConfig(
        model=_spec(config["model"]),
        data=_spec(config["data"]) if config.get("data") else None,
        trainer=trainer,
        autocheckpoint=_autocheckpoint_args(trainer.get("callbacks")),
    )


def read_config_yaml(path: Path) -> dict[str, Any]:
    """A config file's YAML data, refused, with the reason, if it is missing, unreadable, empty, not YAML,
    not a mapping, over :data:`MAX_CONFIG_BYTES`, over :data:`MAX_CONFIG_NODES` once its aliases are
    expanded (a "billion laughs" file), or writes an AutoCheckpoint number other than in decimal.

    Raises:
        ValueError: naming the file and what is wrong.
    """
    where = f"`config` {str(path)!r}"
    if not Path(path).is_file():
        raise ValueError(f"`config` must name an existing YAML file, got {str(path)!r}")
    try:
        size_bytes = Path(path).stat().st_size
        if size_bytes > MAX_CONFIG_BYTES:
            raise ValueError(f"{where} must be at most {MAX_CONFIG_BYTES} bytes, got {size_bytes}")
        node, data = _compose_and_construct(Path(path).read_text(), where)
    except OSError as error:
        raise ValueError(f"{where} cannot be read: {error.strerror}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        reason = " ".join(str(error).split())
        raise ValueError(f"{where} is not valid YAML: {reason}") from None
    except RecursionError:
        raise ValueError(f"{where} is nested too deeply to be a training config") from None
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise ValueError(
            f"{where} must be a YAML mapping with at least `model:` (and usually `data:` and"
            f" `trainer:`), got {got}"
        )
    _check_decimal_numbers(node, where)
    return data


def _compose_and_construct(text: str, where: str) -> tuple[yaml.Node | None, Any]:
    """The document's node graph and its data, built only once its expanded size is known to be small."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        nodes = _expanded_nodes(node, {}, set())
        if nodes > MAX_CONFIG_NODES:
            raise ValueError(
                f"{where} must expand to at most {MAX_CONFIG_NODES} YAML nodes (aliases counted as what"
                f" they repeat), got {nodes if nodes < 10**15 else f'{nodes:.3g}'}"
            )
        return node, loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_nodes(node: yaml.Node, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """How many nodes ``node`` is once every alias is written out (memoized: linear in the graph)."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_nodes:  # an alias inside its own anchor: infinite
        return MAX_CONFIG_NODES + 1
    open_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        children = [child for pair in node.value for child in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    else:
        children = []
    sizes[id(node)] = 1 + sum(_expanded_nodes(child, sizes, open_nodes) for child in children)
    open_nodes.discard(id(node))
    return sizes[id(node)]


def _check_decimal_numbers(root: yaml.Node, where: str) -> None:
    """Refuse an AutoCheckpoint number written other than in decimal: YAML and jsonargparse read
    ``0x10`` and ``"0x10"`` as 16, ``020`` as 16 (octal), ``1:30`` as 90 (base 60), ``1_0`` as 10."""
    callbacks = _child(_child(root, "trainer"), "callbacks")
    entries = callbacks.value if isinstance(callbacks, yaml.SequenceNode) else [callbacks]
    for index, entry in enumerate(entries):
        class_path = _child(entry, "class_path")
        if not isinstance(class_path, yaml.ScalarNode) or not class_path.value.endswith("AutoCheckpoint"):
            continue
        for key in _NUMERIC_ARGS:
            value = _child(_child(entry, "init_args"), key)
            if isinstance(value, yaml.ScalarNode) and not _DECIMAL.fullmatch(value.value.strip()):
                read_as = _as_parsed(key, value.value)  # .inf and .nan: left to AutoCheckpoint's own check
                if (
                    isinstance(read_as, (int, float))
                    and not isinstance(read_as, bool)
                    and math.isfinite(read_as)
                ):
                    raise ValueError(
                        f"{where}, trainer.callbacks[{index}] ({class_path.value}): `{key}` must be written"
                        f" as a decimal number (e.g. 16 or 0.12), got {value.value!r}, which YAML reads as"
                        f" {read_as!r}"
                    )


def _child(node: yaml.Node | None, key: str) -> yaml.Node | None:
    """The value node under ``key`` of a mapping node (None if ``node`` is not a mapping or lacks it)."""
    if not isinstance(node, yaml.MappingNode):
        return None
    return next((value for name, value in node.value if getattr(name, "value", None) == key), None)


def _parse(config_path: str, overrides: list[str], data: dict[str, Any]) -> dict[str, Any]:
    """LightningCLI's parse of the config as plain data; its errors become ``ValueError`` (no exit), and a bad
    AutoCheckpoint value in the file is AutoCheckpoint's own message, not jsonargparse's nested one."""
    with warnings.catch_warnings(), importable_working_directory():
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")  # no sys.argv: intended
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
            if "AutoCheckpoint" in reason:
                check_autocheckpoint_values(data, f"the config {config_path!r}")
            raise ValueError(
                f"the config {config_path!r} (with overrides {overrides}) does not parse: {reason}"
            ) from None
    return cli.config.as_dict()


def check_autocheckpoint_values(config: Mapping[str, Any], source: str = "") -> None:
    """AutoCheckpoint's own checks on each AutoCheckpoint of a config's ``trainer.callbacks``: a YAML file's
    data (a string for a number or a bool is read as YAML, as the parser reads it) or a parsed config.

    Raises:
        ValueError: the first value refused, where it is and AutoCheckpoint's message (the key, what is
            allowed, what was given). A missing or unknown argument is left to the parser, which names it.

    Example:
        >>> entry = {"class_path": "lightning_ckpt.AutoCheckpoint", "init_args": {"budget_gb": "40GB"}}
        >>> check_autocheckpoint_values({"trainer": {"callbacks": [entry]}}, "run.yaml")
        Traceback (most recent call last):
        ...
        ValueError: run.yaml, trainer.callbacks[0] (lightning_ckpt.AutoCheckpoint): `budget_gb` must be a positive finite number of GB up to 1e+09, got '40GB'
    """
    trainer = config.get("trainer")
    callbacks = trainer.get("callbacks") if isinstance(trainer, Mapping) else None
    entries = callbacks if isinstance(callbacks, list) else [callbacks]
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or not str(entry.get("class_path")).endswith("AutoCheckpoint"):
            continue
        init_args = entry.get("init_args") or {}
        if not isinstance(init_args, Mapping):
            continue
        try:
            AutoCheckpointConfig(**{key: _as_parsed(key, value) for key, value in init_args.items()})
        except TypeError:
            continue
        except ValueError as error:
            where = f"trainer.callbacks[{index}]" if isinstance(callbacks, list) else "trainer.callbacks"
            where = f"{source}, {where}" if source else where
            raise ValueError(f"{where} ({entry['class_path']}): {error}") from None


def _as_parsed(key: str, value: Any) -> Any:
    """A YAML string for a number or a bool (``"0.12"``) as the parser takes it; ``"40GB"`` stays a string."""
    if isinstance(value, str) and key not in ("targets", "cost", "solver"):
        with contextlib.suppress(yaml.YAMLError):
            return yaml.safe_load(value)
    return value


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
