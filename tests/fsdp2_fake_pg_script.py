"""Run by tests/test_fsdp2.py: FSDP2 pieces on one process, with torch's fake process group of 4 ranks
(collectives move no data, so values are garbage, but every rank-local tensor has its real size).

Usage: python tests/fsdp2_fake_pg_script.py OUT_JSON. Writes what the test checks:

- ``entry``/``shards``/``whole``: what ``memory_cap(model=...)`` counts on entry for a model sharded by
  ``fully_shard`` over 4 ranks, this rank's shards (their storages), the whole parameters;
- ``after_step``/``state``: what it counts after a forward, backward and AdamW step, and the storages of
  the shards, their gradients and the optimizer state;
- ``gathered_op``: the peak and the live bytes after a softmax over a ``Shard(0)`` DTensor's sharded
  dimension (DTensor gathers the whole tensor first: a temporary of its own, as big as the result);
- ``root_sharded_after``: whether the root's parameters are shards again after a no-grad forward, without
  and inside ``iteration_state_reset``;
- ``profiles``: per block, what the profile finds saved (activation and input bytes) for the model
  sharded and not (FSDP2's gathered parameters are no activations), what the step still holds after
  its backward (the loss, not FSDP2's sharded gradients) and the sharded profile's static parameters;
- ``candidates``: the candidates of the sharded model, by default and for the target ``"Block"`` (its
  blocks' class is ``FSDPBlock`` now);
- ``example_sharded``: whether the example GPT's ``configure_model`` shards it, with and without a
  device mesh (other strategies give none);
- ``post_forward``: the unchecked peak of a step on a fake twin sharded with ``reshard_after_forward``
  True, 2 and False, the bytes of a block's parameters, torch's error for ``reshard_after_forward=3``,
  and whether a twin sharded with 2 reuses the live model's 2-rank meshes;
- ``refusals``: the one-line errors for HSDP, tensor parallelism, ``ModelParallelStrategy(tensor_parallel_size=2)``
  and ``plan_offline`` of an FSDP2 config in a process that has a process group already (this one).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from callback_helpers import TINY_GPT, next_token_pairs, tiny_gpt, token_batch  # noqa: E402

from lightning_ckpt.core.candidates import find_candidates  # noqa: E402
from lightning_ckpt.core.fsdp2 import check_data_parallel  # noqa: E402
from lightning_ckpt.core.storage import unique_storage_bytes  # noqa: E402
from lightning_ckpt.lightning.checks import check_trainer  # noqa: E402
from lightning_ckpt.testing import memory_cap  # noqa: E402

WORLD = 4


def sharded_gpt(mesh):
    from torch.distributed.fsdp import fully_shard

    model = tiny_gpt(dropout=0.0)
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def counted_step(mesh) -> dict:
    model = sharded_gpt(mesh)
    idx, targets = token_batch(model, batch_size=2)
    optimizer = torch.optim.AdamW(model.parameters())
    with memory_cap(10**9, model=model) as cap:
        entry = cap.live_bytes
        model(idx, targets)[1].backward()
        optimizer.step()
        after_step = cap.live_bytes
    params = list(model.parameters())
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return {
        "entry": entry,
        "shards": unique_storage_bytes(params),
        "whole": sum(p.numel() * p.element_size() for p in params),
        "after_step": after_step,
        "state": unique_storage_bytes([*params, *(p.grad for p in params), *state]),
    }


def gathered_op(mesh) -> dict:
    from torch.distributed.tensor import Shard, distribute_tensor

    from lightning_ckpt.core.storage import LiveStorageTracker

    sharded = distribute_tensor(torch.randn(64, 64), mesh, [Shard(0)])
    with LiveStorageTracker() as tracker:
        out = torch.softmax(sharded, dim=0)
    return {"peak": tracker.peak_bytes, "live": tracker.live_bytes, "result": out._local_tensor.nbytes}


def root_sharded_after(mesh) -> dict:
    from torch.distributed.tensor import DTensor

    from lightning_ckpt.core.fsdp2 import iteration_state_reset

    model = sharded_gpt(mesh)
    idx, _ = token_batch(model, batch_size=2)
    with torch.no_grad():
        model(idx)
    plain = isinstance(model.transformer.wte.weight, DTensor)
    with iteration_state_reset(model), torch.no_grad():
        model(idx)
    return {"no_grad_forward": plain, "inside_reset": isinstance(model.transformer.wte.weight, DTensor)}


def profiles(mesh) -> dict:
    from callback_helpers import block_names, gpt_loss

    from lightning_ckpt.core.profiler import profile_step

    found = {}
    for name, model in (("plain", tiny_gpt(dropout=0.0)), ("sharded", sharded_gpt(mesh))):
        batch = token_batch(model, batch_size=2)
        profile = profile_step(model, lambda m=model, b=batch: gpt_loss(m, *b), block_names(model), "flops")
        found[name] = {
            "blocks": [(m.activation_bytes, m.input_bytes) for m in profile.modules],
            "after_backward": profile.after_backward_bytes,
            "param_bytes": profile.static.param_bytes,
        }
    return found


def post_forward(mesh_2d) -> dict:
    """The unchecked peak of the example GPT's step (rank 0's batch of the 4-rank tests, (4, 32)) on a
    fake twin sharded with each ``reshard_after_forward``, the bytes of one block's parameters, and the
    error ``fully_shard`` gives for an int that does not divide the world size."""
    from fsdp2_script import ShardedGPT
    from torch.distributed.fsdp import fully_shard

    from lightning_ckpt.core.fsdp2 import post_forward_meshes
    from lightning_ckpt.lightning.fake_run import profile_run_on_fake_tensors
    from lightning_ckpt.lightning.run_spec import ClassSpec, RunConfig
    from lightning_ckpt.planning.peak import predict_peak_bytes

    strategy = ClassSpec("lightning.pytorch.strategies.ModelParallelStrategy", {"data_parallel_size": WORLD})
    batch = next_token_pairs(4, 32, seed=0)
    unchecked = {}
    for sharding in ("reshard", "reshard-2", "keep"):
        spec = ClassSpec(
            f"{ShardedGPT.__module__}.ShardedGPT", {**TINY_GPT, "dropout": 0.0, "sharding": sharding}
        )
        run = RunConfig(spec, None, {"devices": WORLD, "strategy": strategy}, None)
        with post_forward_meshes(None):  # no live model here: made outside the fake mode
            profile = profile_run_on_fake_tensors(run, None, batch, device_mesh=mesh_2d).profile
        unchecked[sharding] = predict_peak_bytes(profile, [])
    block = tiny_gpt(dropout=0.0).transformer.h[0]
    return {
        "twin_reuses_live_meshes": twin_reuses_live_meshes(mesh_2d),
        "unchecked": unchecked,
        "block_bytes": sum(p.numel() * p.element_size() for p in block.parameters()),
        "refusal": refusal(
            lambda: fully_shard(block, mesh=mesh_2d["data_parallel"], reshard_after_forward=3)
        ),
    }


def twin_reuses_live_meshes(mesh_2d) -> bool:
    """Whether a fake twin sharded with ``reshard_after_forward=2`` inside ``post_forward_meshes(live)``
    reshards each block to one of the live model's 2-rank meshes (no new mesh, no new process group)."""
    from fsdp2_script import ShardedGPT

    from lightning_ckpt._compat import FakeTensorMode, fsdp2_post_forward_mesh_infos, give_device_mesh
    from lightning_ckpt.core.fsdp2 import post_forward_meshes

    def sharded(fake: bool) -> ShardedGPT:
        with FakeTensorMode() if fake else contextlib.nullcontext():
            model = ShardedGPT(sharding="reshard-2", **TINY_GPT)
            give_device_mesh(model, mesh_2d)
            model.configure_model()
        return model

    live = sharded(fake=False)
    with post_forward_meshes(live):
        twin = sharded(fake=True)
    live_infos = [info for block in live.transformer.h for info in fsdp2_post_forward_mesh_infos(block)]
    twin_infos = [info for block in twin.transformer.h for info in fsdp2_post_forward_mesh_infos(block)]
    return len(twin_infos) == 4 and all(any(info is own for own in live_infos) for info in twin_infos)


def example_sharded(mesh_2d) -> list[bool]:
    from lightning_ckpt._compat import give_device_mesh
    from lightning_ckpt.core.fsdp2 import is_fsdp2

    found = []
    for mesh in (mesh_2d, None):
        model = tiny_gpt()
        give_device_mesh(model, mesh)
        model.configure_model()
        found.append(is_fsdp2(model) and all(is_fsdp2(block) for block in model.transformer.h))
    return found


def refusal(fn) -> str:
    try:
        fn()
    except ValueError as error:
        return str(error)
    return "not refused"


def offline_in_a_process_group(out: Path) -> str:
    """``plan_offline`` of an FSDP2 config here, where the fake process group is initialized already."""
    from lightning_ckpt.offline.plan import plan_offline

    config = out.with_suffix(".yaml")
    config.write_text(
        "trainer:\n  devices: 4\n  strategy:\n"
        "    class_path: lightning.pytorch.strategies.ModelParallelStrategy\n"
        "    init_args: {data_parallel_size: 4, tensor_parallel_size: 1}\n"
        "  callbacks:\n    - class_path: lightning_ckpt.AutoCheckpoint\n      init_args: {budget_gb: 1}\n"
        "model:\n  class_path: examples.gpt.GPT\n  init_args: {block_size: 32, n_layer: 2}\n"
        "data:\n  class_path: examples.data.CharDataModule\n"
        "  init_args: {block_size: 32, batch_size: 2, max_chars: 5000, train_samples: 4, val_samples: 2}\n"
    )
    return refusal(lambda: plan_offline(config))


def refusals() -> dict:
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh_2d = init_device_mesh("cpu", (2, 2), mesh_dim_names=("data_parallel", "tensor_parallel"))
    hsdp = tiny_gpt(dropout=0.0)
    fully_shard(hsdp, mesh=mesh_2d)  # a 2-D mesh: HSDP (replicate over dim 0, shard over dim 1)
    tensor_parallel = tiny_gpt(dropout=0.0)
    for block in tensor_parallel.transformer.h:
        parallelize_module(
            block.mlp, mesh_2d["tensor_parallel"], {"c_fc": ColwiseParallel(), "c_proj": RowwiseParallel()}
        )
    strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2)
    strategy._device_mesh = mesh_2d  # as its setup_environment leaves it
    return {
        "hsdp": refusal(lambda: check_data_parallel(hsdp)),
        "tensor_parallel": refusal(lambda: check_data_parallel(tensor_parallel)),
        "strategy": refusal(lambda: check_trainer(SimpleNamespace(strategy=strategy), tiny_gpt())),
    }


def main(out: Path) -> None:
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("data_parallel",))
    results = counted_step(mesh) | {
        "gathered_op": gathered_op(mesh),
        "root_sharded_after": root_sharded_after(mesh),
        "profiles": profiles(mesh),
        "candidates": [find_candidates(sharded_gpt(mesh), targets) for targets in (None, ["Block"])],
        "refusals": refusals() | {"offline": offline_in_a_process_group(out)},
    }
    mesh_2d = init_device_mesh("cpu", (WORLD, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
    results |= {"example_sharded": example_sharded(mesh_2d), "post_forward": post_forward(mesh_2d)}
    check_data_parallel(sharded_gpt(mesh))  # FSDP2 data parallelism: accepted
    out.write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
