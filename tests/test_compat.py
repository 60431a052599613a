"""Private torch and Lightning names live in `lightning_ckpt._compat` alone, and still resolve."""

from __future__ import annotations

import ast
from pathlib import Path

import torch
from torch import nn

from lightning_ckpt import _compat

PACKAGE = Path(_compat.__file__).resolve().parent


def _private_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            root = node.module.split(".")[0]
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if root in ("torch", "lightning") and any(
                part.startswith("_") and part != "__future__" for n in names for part in n.split(".")
            ):
                found.append(node.module)
        if isinstance(node, ast.Attribute) and node.attr in ("_C", "_cdata", "_module_classes"):
            found.append(node.attr)
    return found


def test_no_private_torch_or_lightning_name_outside_compat():
    offenders = {
        str(path.relative_to(PACKAGE)): names
        for path in PACKAGE.rglob("*.py")
        if path.name != "_compat.py" and (names := _private_imports(path))
    }
    assert offenders == {}


def test_the_private_names_still_resolve():
    states = _compat.collect_rng_states()
    expected = torch.rand(3)
    _compat.set_rng_states(states)
    torch.testing.assert_close(torch.rand(3), expected)
    assert _compat.convert_precision(32) == "32-true"
    assert _compat.autocast_enabled() is False
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _compat.autocast_enabled() is True
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    assert _compat.fsdp_policy_classes(ModuleWrapPolicy({nn.Linear})) == [nn.Linear]
    assert isinstance(nn.BatchNorm1d(2), _compat.NormBase)
    with _compat.FakeTensorMode():
        assert isinstance(torch.empty(2), _compat.FakeTensor)
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    assert CheckpointWrapper.__name__ == _compat.CHECKPOINT_WRAPPER_CLASS
    assert type(torch.compile(nn.Linear(2, 2))).__name__ == _compat.COMPILED_MODULE_CLASS
