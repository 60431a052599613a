"""Every checkpointing choice of the tiny GPT's 4 blocks, predicted against the peak measured in a fit.

One Lightning fit runs one warm-up step (gradients and optimizer state made) and then one step per
choice, the choice's blocks wrapped before its step; :class:`lightning_ckpt.testing.memory_cap` counts
every live storage, and each step's peak is read from the cap. The prediction is the block-level peak
model on the profile AutoCheckpoint makes in a fit. The data set is made before the cap: on a device only
the batch is there.
"""

from __future__ import annotations

import itertools

from callback_helpers import block_names, fast_trainer, probe_profile, tiny_gpt, token_loader
from lightning.pytorch.callbacks import Callback

from lightning_ckpt.core.wrapping import apply_checkpointing, remove_checkpointing
from lightning_ckpt.planning.peak import PeakModel
from lightning_ckpt.testing import memory_cap


class _ChoicePerStep(Callback):
    """Step 0 plain; step ``k`` with ``choices[k - 1]`` checkpointed; each step's peak on ``cap``."""

    def __init__(self, choices: list[list[str]], cap: memory_cap) -> None:
        self.choices, self.cap, self.peak_bytes = choices, cap, {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        remove_checkpointing(pl_module)
        if batch_idx:
            apply_checkpointing(pl_module, self.choices[batch_idx - 1])
        self.cap.peak_bytes = self.cap.live_bytes  # this step's peak from here

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.peak_bytes[batch_idx] = self.cap.peak_bytes


def test_every_block_choice_of_the_tiny_gpt_is_predicted_never_under_its_measured_peak():
    """Never under (an out-of-memory crash on a device), and over by at most 0.1%."""
    names = block_names(tiny_gpt())
    choices = [list(c) for count in range(len(names) + 1) for c in itertools.combinations(names, count)]
    peak = PeakModel(probe_profile(tiny_gpt(), token_loader()))
    model, data = tiny_gpt(), token_loader(num_batches=len(choices) + 1)
    with memory_cap(10**12, model=model) as cap:
        steps = _ChoicePerStep(choices, cap)
        fast_trainer([steps], max_steps=len(choices) + 1).fit(model, train_dataloaders=data)
    for step, checkpointed in enumerate(choices, start=1):
        predicted, measured = peak.peak_bytes(checkpointed), steps.peak_bytes[step]
        what = f"{checkpointed}: predicted {predicted} B, measured {measured} B"
        assert measured <= predicted <= measured * 1.001, what
