"""AutoCheckpoint inside a real (CPU) Lightning fit."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from callback_helpers import TINY_GPT, block_names, fast_trainer, fit, tiny_gpt, token_loader
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils._python_dispatch import _get_current_dispatch_mode

import lightning_ckpt.callback as callback_module
import lightning_ckpt.lightning.apply_plan as apply_plan_module
import lightning_ckpt.lightning.granularity as granularity_module
import lightning_ckpt.lightning.ranks as ranks_module
from lightning_ckpt import AutoCheckpoint, CheckpointPlan
from lightning_ckpt.core.memory.meter import track_peak_bytes
from lightning_ckpt.core.wrapping import checkpointed_names
from lightning_ckpt.planning import BudgetTooSmallError
from lightning_ckpt.planning.peak import fixed_peak_bytes, predict_peak_bytes

GB = 1e9


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"budget_gb": -1}, r"`budget_gb` must be a positive finite number of GB up to 1e\+09, got -1"),
        ({"budget_gb": 0}, r"`budget_gb` must be .* got 0"),
        ({"budget_gb": math.nan}, r"`budget_gb` must be .* got nan"),
        ({"budget_gb": math.inf}, r"`budget_gb` must be .* got inf"),
        ({"budget_gb": "40"}, r"`budget_gb` must be .* got '40'"),
        ({"budget_gb": True}, r"`budget_gb` must be .* got True"),
        ({"budget_gb": 1, "targets": [3]}, r"`targets` must be None or a list .* got \[3\]"),
        ({"budget_gb": 1, "cost": "memory"}, r"`cost` must be one of \('time', 'flops'\), got 'memory'"),
        ({"budget_gb": 1, "solver": "magic"}, r"`solver` must be one of .*'auto'.* got 'magic'"),
        ({"budget_gb": 1, "quantum_bytes": 0}, r"`quantum_bytes` must be a positive integer, got 0"),
        ({"budget_gb": 1, "workers": 1.5}, r"`workers` must be a positive integer, got 1.5"),
    ],
)
def test_bad_arguments_raise_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AutoCheckpoint(**kwargs)


class WrappedSpy(Callback):
    """Records which modules are checkpoint-wrapped while training runs."""

    names: list[str] | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.names = sorted(checkpointed_names(pl_module))


def _profile_bounds(model) -> tuple[int, int, object]:
    """Predicted peak with every block checkpointed and with none, from a profiling run."""
    probe = AutoCheckpoint(budget_gb=1000, measure=False)
    fit(model, [probe], max_steps=1)
    profile = probe.profile
    everything = [m.name for m in profile.modules]
    return predict_peak_bytes(profile, everything), predict_peak_bytes(profile, []), profile


def test_huge_budget_checkpoints_nothing():
    model = tiny_gpt()
    callback = AutoCheckpoint(budget_gb=1000)
    fit(model, [callback], max_steps=3)
    plan = callback.plan
    assert isinstance(plan, CheckpointPlan)
    assert plan.checkpointed == ()
    assert plan.kept == tuple(block_names(model))
    assert plan.measured_peak_bytes is not None and 0 < plan.measured_peak_bytes <= plan.budget_bytes
    assert checkpointed_names(model) == []


def test_tight_budget_checkpoints_some_and_fits():
    low_bytes, high_bytes, profile = _profile_bounds(tiny_gpt())
    budget_bytes = (fixed_peak_bytes(profile) + high_bytes) // 2
    model, spy = tiny_gpt(), WrappedSpy()
    callback = AutoCheckpoint(budget_gb=budget_bytes / GB)
    fit(model, [callback, spy], max_steps=4)
    plan = callback.plan
    assert spy.names == sorted(plan.checkpointed), "the planned modules are wrapped during training"
    assert checkpointed_names(model) == [], "and unwrapped when fit ends"
    assert 0 < len(plan.checkpointed) < len(block_names(model))
    assert sorted(plan.checkpointed + plan.kept) == sorted(block_names(model))
    assert plan.predicted_peak_bytes <= budget_bytes
    assert plan.measured_peak_bytes is not None and plan.measured_peak_bytes <= budget_bytes
    assert low_bytes <= plan.predicted_peak_bytes < high_bytes
    assert "checkpoint" in str(plan) and "keep" in str(plan)


def test_impossible_budget_names_the_smallest_budget_and_leaves_model_untouched():
    model = tiny_gpt()
    with pytest.raises(
        BudgetTooSmallError, match=r"`budget_gb`=1e-06 is too small.*smallest budget that works is budget_gb="
    ):
        fit(model, [AutoCheckpoint(budget_gb=1e-6)], max_steps=1)
    assert checkpointed_names(model) == []
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_parameters_match_a_run_without_the_callback():
    _, high_bytes, profile = _profile_bounds(tiny_gpt())
    budget_gb = (fixed_peak_bytes(profile) + high_bytes) / 2 / GB
    plain, wrapped = tiny_gpt(seed=3), tiny_gpt(seed=3)
    fit(plain, max_steps=4, seed=7)
    callback = AutoCheckpoint(budget_gb=budget_gb)
    fit(wrapped, [callback], max_steps=4, seed=7)
    assert callback.plan.checkpointed, "the budget should force some checkpointing"
    for (name, p_plain), (_, p_wrapped) in zip(
        plain.named_parameters(), wrapped.named_parameters(), strict=True
    ):
        torch.testing.assert_close(p_wrapped, p_plain, msg=name)


def test_metrics_reach_the_logger(tmp_path):
    callback = AutoCheckpoint(budget_gb=1000)
    fit(tiny_gpt(), [callback], max_steps=3, logger=CSVLogger(tmp_path, name="run"))
    metrics = (tmp_path / "run" / "version_0" / "metrics.csv").read_text()
    for key in (
        "autockpt/predicted_peak_gb",
        "autockpt/measured_peak_gb",
        "autockpt/num_checkpointed",
        "autockpt/recompute_ms_per_step",
    ):
        assert key in metrics


def test_validation_and_sanity_steps_do_not_plan():
    callback = AutoCheckpoint(budget_gb=1000)
    trainer = fast_trainer([callback], max_steps=2, num_sanity_val_steps=2, limit_val_batches=2)
    trainer.validate(tiny_gpt(), dataloaders=token_loader())
    assert callback.plan is None
    trainer.fit(tiny_gpt(), train_dataloaders=token_loader(), val_dataloaders=token_loader())
    assert callback.plan is not None


def test_gradient_accumulation_and_bf16_mixed():
    _, high_bytes, profile = _profile_bounds(tiny_gpt())
    budget_gb = (fixed_peak_bytes(profile) + high_bytes) / 2 / GB
    callback = AutoCheckpoint(budget_gb=budget_gb)
    trainer = fit(tiny_gpt(), [callback], max_steps=2, accumulate_grad_batches=2, precision="bf16-mixed")
    assert trainer.global_step == 2
    assert callback.plan.measured_peak_bytes is not None


def test_state_dict_round_trip_and_state_key():
    callback = AutoCheckpoint(budget_gb=1000)
    fit(tiny_gpt(), [callback], max_steps=2)
    restored = AutoCheckpoint(budget_gb=1000)
    restored.load_state_dict(callback.state_dict())
    assert restored.plan == callback.plan
    assert "1000" in callback.state_key and AutoCheckpoint(budget_gb=8).state_key != callback.state_key


def test_resume_checks_the_saved_plan_once_keeps_it_and_matches_uninterrupted(tmp_path, monkeypatch):
    _, high_bytes, profile = _profile_bounds(tiny_gpt())
    budget_gb = (fixed_peak_bytes(profile) + high_bytes) / 2 / GB
    # Lightning restores neither the global RNG nor a plain DataLoader's position: no dropout, and the
    # checkpoint is taken after the last batch of an epoch (3 batches per epoch), so the runs can agree exactly.
    loader = token_loader(num_batches=3)
    full = tiny_gpt(seed=5, dropout=0.0)
    L.seed_everything(11, verbose=False)
    fast_trainer([AutoCheckpoint(budget_gb=budget_gb)], max_steps=6).fit(full, train_dataloaders=loader)

    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
    first = AutoCheckpoint(budget_gb=budget_gb)
    L.seed_everything(11, verbose=False)
    trainer = fast_trainer([first, saver], max_steps=3, enable_checkpointing=True)
    trainer.fit(tiny_gpt(seed=5, dropout=0.0), train_dataloaders=loader)
    ckpt = next(tmp_path.glob("*step=3.ckpt"))

    profiles, solves = [], []
    real_profile, real_decide = callback_module.profile_in_fit, granularity_module.decide_plan
    monkeypatch.setattr(
        callback_module, "profile_in_fit", lambda *a, **k: profiles.append(1) or real_profile(*a, **k)
    )
    monkeypatch.setattr(
        granularity_module, "decide_plan", lambda *a, **k: solves.append(1) or real_decide(*a, **k)
    )
    resumed_model, second = tiny_gpt(seed=99, dropout=0.0), AutoCheckpoint(budget_gb=budget_gb)
    trainer = fast_trainer([second], max_steps=6)
    trainer.fit(resumed_model, train_dataloaders=loader, ckpt_path=ckpt)
    assert (len(profiles), len(solves)) == (1, 0), (
        "one fresh profile checks the saved plan; nothing is solved"
    )
    assert second.plan.checkpointed == first.plan.checkpointed
    assert second.plan.predicted_peak_bytes == first.plan.predicted_peak_bytes
    assert second.plan.measured_peak_bytes is not None, "measured again on a resumed step"
    for (name, p_full), (_, p_resumed) in zip(
        full.named_parameters(), resumed_model.named_parameters(), strict=True
    ):
        torch.testing.assert_close(p_resumed, p_full, msg=name)


def test_manual_optimization_is_refused():
    model = tiny_gpt()
    model.automatic_optimization = False
    with pytest.raises(ValueError, match="automatic optimization"):
        fit(model, [AutoCheckpoint(budget_gb=1)], max_steps=1)


def test_compiled_submodule_is_refused():
    model = tiny_gpt()
    model.transformer.h[0] = torch.compile(model.transformer.h[0])
    with pytest.raises(ValueError, match="torch.compile"):
        fit(model, [AutoCheckpoint(budget_gb=1)], max_steps=1)


def test_overshoot_triggers_one_replan(monkeypatch):
    _, high_bytes, profile = _profile_bounds(tiny_gpt())
    budget_bytes = (fixed_peak_bytes(profile) + high_bytes) // 2
    real_stop = track_peak_bytes.stop
    inflated = iter([budget_bytes + 10_000, budget_bytes + 10_000])  # the second overshoot must not re-plan
    first_checkpointed: list[int] = []
    callback = AutoCheckpoint(budget_gb=budget_bytes / GB)

    def stop_with_overshoot(meter):
        first_checkpointed.append(len(callback.plan.checkpointed))
        measured = real_stop(meter)
        fake = next(inflated, None)
        return measured if fake is None else fake

    monkeypatch.setattr(track_peak_bytes, "stop", stop_with_overshoot)
    with pytest.warns(UserWarning, match="over the budget"):
        fit(tiny_gpt(), [callback], max_steps=4)
    assert callback.plan.replanned
    assert callback.plan.budget_bytes == budget_bytes
    assert callback.plan.predicted_peak_bytes <= budget_bytes - 10_000, (
        "re-planned with the overshoot subtracted"
    )
    assert len(callback.plan.checkpointed) >= first_checkpointed[0]


def test_target_matching_nothing_fails_in_setup_with_existing_names():
    model = tiny_gpt()
    with pytest.raises(ValueError, match=r"`targets` entry 'Nope' matches no module.*transformer"):
        fit(model, [AutoCheckpoint(budget_gb=1, targets=["Nope"])], max_steps=1)
    assert checkpointed_names(model) == []


def test_finer_targets_checkpoint_attention_and_mlp_separately():
    _, high_bytes, profile = _profile_bounds(tiny_gpt())
    callback = AutoCheckpoint(
        budget_gb=(fixed_peak_bytes(profile) + high_bytes) / 2 / GB, targets=["MLP", "CausalSelfAttention"]
    )
    fit(tiny_gpt(), [callback], max_steps=3)
    names = callback.plan.checkpointed + callback.plan.kept
    assert sorted(names) == sorted(f"transformer.h.{i}.{part}" for i in range(4) for part in ("attn", "mlp"))
    assert callback.plan.predicted_peak_bytes <= callback.plan.budget_bytes


class FailingGPT(type(tiny_gpt())):
    """Raises in its third training step."""

    def training_step(self, batch, batch_idx):
        if batch_idx == 2:
            raise RuntimeError("boom at step 3")
        return super().training_step(batch, batch_idx)


def test_an_exception_during_training_leaves_no_wrapper_and_no_meter():
    _, high_bytes, profile = _profile_bounds(tiny_gpt())
    torch.manual_seed(0)
    model = FailingGPT(**TINY_GPT)
    callback = AutoCheckpoint(budget_gb=(fixed_peak_bytes(profile) + high_bytes) / 2 / GB)
    with pytest.raises(RuntimeError, match="boom at step 3"):
        fit(model, [callback], max_steps=5)
    assert callback.plan.checkpointed, "the run was checkpointing when it failed"
    assert checkpointed_names(model) == [] and _get_current_dispatch_mode() is None, "no meter left measuring"


def test_a_planning_failure_leaves_the_model_untouched(monkeypatch):
    def broken_plan(*args, **kwargs):
        raise RuntimeError("solver exploded")

    monkeypatch.setattr(ranks_module, "make_plan", broken_plan)
    model = tiny_gpt()
    with pytest.raises(RuntimeError, match="solver exploded"):
        fit(model, [AutoCheckpoint(budget_gb=1)], max_steps=2)
    assert checkpointed_names(model) == []


def test_resumed_run_that_overshoots_profiles_again_and_replans(tmp_path, monkeypatch):
    """A plan saved before its peak was measured is measured after resuming; an overshoot re-plans."""
    _, high_bytes, profile = _profile_bounds(tiny_gpt())
    budget_bytes = (fixed_peak_bytes(profile) + high_bytes) // 2
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)
    fit(
        tiny_gpt(),
        [AutoCheckpoint(budget_gb=budget_bytes / GB), saver],
        max_steps=1,
        enable_checkpointing=True,
    )
    ckpt = next(tmp_path.glob("*step=1.ckpt"))
    real_stop = track_peak_bytes.stop
    monkeypatch.setattr(track_peak_bytes, "stop", lambda meter: real_stop(meter) + budget_bytes)
    callback = AutoCheckpoint(budget_gb=budget_bytes / GB)
    with pytest.warns(UserWarning, match="over the budget"):
        fast_trainer([callback], max_steps=3).fit(
            tiny_gpt(), train_dataloaders=token_loader(), ckpt_path=ckpt
        )
    assert callback.plan.replanned and callback.profile is not None


def _saved_state(budget_gb: float = 1000) -> dict:
    callback = AutoCheckpoint(budget_gb=budget_gb)
    fit(tiny_gpt(), [callback], max_steps=1)
    return callback.state_dict()


@pytest.mark.parametrize(
    "damage",
    [
        lambda plan: plan.update(checkpointed=5),
        lambda plan: plan.pop("budget_bytes"),
        lambda plan: plan.update(budget_bytes="many"),
        lambda plan: plan.update(items=[{"name": "transformer.h.0"}]),
        lambda plan: plan.update(kept=["not.a.module"]),
    ],
    ids=["checkpointed-not-a-list", "field-missing", "wrong-type", "item-incomplete", "names-do-not-split"],
)
def test_a_damaged_saved_plan_gives_one_warning_and_a_fresh_profile(damage):
    state = _saved_state()
    damage(state["plans"][0][1])
    callback = AutoCheckpoint(budget_gb=1000)
    with pytest.warns(
        UserWarning, match=r"the checkpoint's saved plans are unusable \(.*\); profiling anew"
    ) as caught:
        callback.load_state_dict(state)
    assert len(caught) == 1 and callback.plans == {}
    fit(tiny_gpt(), [callback], max_steps=1)
    assert callback.profile is not None and callback.plan.kept == tuple(block_names(tiny_gpt()))


def test_a_saved_plan_naming_a_non_candidate_is_not_applied(monkeypatch):
    state = _saved_state(budget_gb=1000)
    plan = state["plans"][0][1]
    lm_head = {
        "name": "lm_head",
        "activation_bytes": 1,
        "input_bytes": 1,
        "recompute_seconds": 0.0,
        "flops": 0,
    }
    plan["items"] = [*plan["items"], lm_head]
    plan["checkpointed"] = ["lm_head"]
    callback = AutoCheckpoint(budget_gb=1000)
    callback.load_state_dict(state)  # well formed: refused only once the model is known
    wrapped: list[list[str]] = []
    monkeypatch.setattr(apply_plan_module, "apply_checkpointing", lambda module, names: wrapped.append(names))
    with pytest.warns(
        UserWarning, match=r"name modules that are not candidates of this model \(lm_head\); profiling"
    ):
        fit(tiny_gpt(), [callback], max_steps=1)
    assert callback.profile is not None and "lm_head" not in callback.plan.checkpointed and wrapped == []


def test_a_second_fit_reuses_plans_for_the_same_model_and_plans_anew_for_another(monkeypatch):
    callback = AutoCheckpoint(budget_gb=1000)
    fit(tiny_gpt(), [callback], max_steps=1)
    first_profile = callback.profile
    fit(tiny_gpt(), [callback], max_steps=1)  # the same model again: its plan, no new profile
    assert callback.profile is first_profile
    fit(tiny_gpt(n_embd=64), [callback], max_steps=1)  # same names, other sizes
    assert callback.profile is not first_profile
    wider_items = callback.plan.items
    fit(tiny_gpt(n_layer=2), [callback], max_steps=1)  # other candidates
    assert callback.plan.kept == ("transformer.h.0", "transformer.h.1")
    assert wider_items[0].activation_bytes != first_profile.modules[0].activation_bytes
