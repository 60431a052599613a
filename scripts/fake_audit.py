"""Compare, op by op, a training step of 41 models on real and on fake tensors.

AutoCheckpoint profiles a step on fake tensors: where a fake kernel gives an output another dtype, shape or
stride than the real kernel, the profile is off by the difference. Run from the repository root (CPU,
about three minutes for all; nothing downloaded)::

    python scripts/fake_audit.py                          # every model below, fp32 and bf16-mixed
    python scripts/fake_audit.py Bert Bart --precision bf16-mixed

The models: the model sweep's 37 architectures and ``OTHERS`` (Swin, ResNet, ``nn.TransformerEncoder``,
the example GPT). A row per model and precision: the ops each run dispatched, the ops dispatched by both whose
outputs differ (the op, its outputs' layouts real -> fake), and the ops only one run made. The latter are
transformers' data-dependent checks (``mask.all()``, which it cannot read on fake tensors, taking its
general path): on the safe side, a few small tensors, or a mask the real step skips (BART's decoder).
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import sys
import warnings
from pathlib import Path

_SWEEP = Path(__file__).resolve().with_name("model_sweep.py")


def _sweep():
    spec = importlib.util.spec_from_file_location("model_sweep", _SWEEP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def op_layouts(model, loss_of, batch, precision: str) -> list[tuple]:
    """``(op, output layouts)`` of each op one step (``loss_of(model, batch)``, its backward) dispatches
    (``prim`` ops and ``.item()`` left out: no memory)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from lightning_ckpt._compat import tree_leaves

    rows = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.namespace != "prim" and func is not torch.ops.aten._local_scalar_dense.default:
                tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
                rows.append((str(func), tuple(_layout(t) for t in tensors)))
            return out

    bf16 = precision == "bf16-mixed"
    with Log(), torch.autocast("cpu", torch.bfloat16, enabled=bf16, cache_enabled=False):
        loss = loss_of(model, batch)
    with Log():
        loss.backward()
    model.zero_grad(set_to_none=True)
    return rows


def _layout(tensor) -> tuple:
    """dtype, shape and strides (a dimension of size 1 has no meaningful stride: left out)."""
    strides = tuple(
        None if size == 1 else stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
    )
    return str(tensor.dtype), tuple(tensor.shape), strides


def _language_model(name: str) -> tuple:
    import torch

    ids = torch.randint(3, 200, (4, 32))
    mask = (torch.arange(32) < torch.tensor([[20], [32], [25], [30]])).long()

    def loss_of(model, batch):
        ids, mask = batch
        return model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss

    return _sweep().model_of(name), (ids * mask, mask), loss_of


def _vision(kind: str) -> tuple:
    import torch
    import transformers

    if kind == "Swin":
        config = transformers.SwinConfig(
            image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4
        )
    else:
        config = transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1])
    model = getattr(transformers, f"{kind}ForImageClassification")(config)
    return model, torch.randn(2, 3, 32, 32), lambda m, b: m(pixel_values=b).logits.float().square().mean()


def _torch_encoder() -> tuple:
    import torch
    from torch import nn

    layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
    model = nn.Sequential(nn.Embedding(100, 64), nn.TransformerEncoder(layer, 3, enable_nested_tensor=False))
    return model, torch.randint(0, 100, (4, 16)), lambda m, b: m(b).float().square().mean()


def _example_gpt() -> tuple:
    import torch

    sys.path.insert(0, str(_SWEEP.parents[1]))
    from examples.gpt import GPT

    model = GPT(vocab_size=100, block_size=32, n_layer=2, n_head=4, n_embd=64)
    return model, torch.randint(0, 100, (4, 16)), lambda m, b: m(b)[0].float().square().mean()


OTHERS = {
    "Swin": lambda: _vision("Swin"),
    "ResNet": lambda: _vision("ResNet"),
    "TransformerEncoder": _torch_encoder,
    "ExampleGPT": _example_gpt,
}
"""Models beside the sweep's language models: transformers' vision models (LayerNorm over permuted
inputs, BatchNorm), ``torch.nn.TransformerEncoder`` and this project's example GPT."""


def audit(name: str, precision: str) -> dict:
    """The real and the fake step of model ``name`` (a sweep architecture, or one of ``OTHERS``)
    compared (see the module docstring)."""
    import torch

    from lightning_ckpt.core.fake_tensors import fake_model
    from lightning_ckpt.core.hf_models import training_without_cache

    torch.manual_seed(0)
    model, batch, loss_of = OTHERS[name]() if name in OTHERS else _language_model(name)
    with training_without_cache(model):  # as AutoCheckpoint trains it (Jamba's cache fails without)
        real = op_layouts(model, loss_of, batch, precision)
        with fake_model(model) as fake:
            fake_rows = op_layouts(model, loss_of, fake.fake(batch), precision)
    report = {
        "ops_real": len(real),
        "ops_fake": len(fake_rows),
        "differ": [],
        "only_real": [],
        "only_fake": [],
    }
    matcher = difflib.SequenceMatcher(None, real, fake_rows, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        ops_real, ops_fake = [r[0] for r in real[i1:i2]], [r[0] for r in fake_rows[j1:j2]]
        if ops_real == ops_fake:  # the same ops, other layouts
            report["differ"] += [
                (a[0], a[1], b[1]) for a, b in zip(real[i1:i2], fake_rows[j1:j2], strict=True)
            ]
        else:
            report["only_real"] += ops_real
            report["only_fake"] += ops_fake
    return report


def main(argv: list[str] | None = None) -> int:
    sweep = _sweep()
    parser = argparse.ArgumentParser(prog="python scripts/fake_audit.py", description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="architectures (default: the sweep's and OTHERS)")
    parser.add_argument(
        "--precision", choices=["32-true", "bf16-mixed"], help="one precision (default: both)"
    )
    args = parser.parse_args(argv)
    for name in args.models:
        try:
            name in OTHERS or sweep.family_of(name)
        except ValueError as error:
            parser.error(f"{error} or of {sorted(OTHERS)}")
    warnings.simplefilter("ignore")
    for name in args.models or [*(n for names in sweep.FAMILIES.values() for n in names), *OTHERS]:
        for precision in [args.precision] if args.precision else ["32-true", "bf16-mixed"]:
            try:
                report = audit(name, precision)
            except Exception as error:  # the model's own failure in a plain loop
                print(f"{name:<18} {precision:<10} failed: {type(error).__name__}: {str(error)[:100]}")
                continue
            print(
                f"{name:<18} {precision:<10} {report['ops_real']} ops real, {report['ops_fake']} fake:"
                f" {len(report['differ'])} differ, {len(report['only_real'])} only real,"
                f" {len(report['only_fake'])} only fake"
            )
            for op, real, fake in report["differ"]:
                print(f"{'':<18} {op}: {real} -> {fake}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
