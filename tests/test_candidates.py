"""Candidate discovery: repeated blocks, class and glob targets, overlaps, unsafe modules, bad targets."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn
from callback_helpers import tiny_gpt

from examples.gpt import GPT
from lightning_ckpt.core.candidates import find_candidates

BLOCKS = [f"transformer.h.{i}" for i in range(3)]


@pytest.fixture
def model() -> GPT:
    return tiny_gpt(n_layer=3, block_size=16)


def test_default_is_the_largest_list_of_repeated_modules(model):
    model.extra = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])  # smaller
    model.mixed = nn.ModuleList([nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2), nn.ReLU()])  # not repeated
    assert find_candidates(model) == BLOCKS


@pytest.mark.parametrize(
    ("targets", "expected"),
    [
        (["Block"], BLOCKS),
        ("Block", BLOCKS),
        (["transformer.h.*.mlp"], [f"{b}.mlp" for b in BLOCKS]),
        (["MLP", "transformer.h.?.attn"], [f"{b}.{part}" for b in BLOCKS for part in ("attn", "mlp")]),
        (["lm_head", "transformer.h.1"], ["transformer.h.1", "lm_head"]),
    ],
)
def test_targets_by_class_name_or_glob(model, targets, expected):
    assert find_candidates(model, targets) == expected


def test_overlapping_targets_keep_the_outermost_and_log_it(model, caplog):
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero"):
        assert find_candidates(model, ["transformer.h.*.mlp", "Block", "Linear"]) == [*BLOCKS, "lm_head"]
    assert "'transformer.h.0.mlp' dropped: its ancestor 'transformer.h.0'" in caplog.text


def test_target_matching_nothing_lists_existing_names(model):
    with pytest.raises(ValueError, match=r"`targets` entry 'Decoder' matches no module.*transformer\.h\.\d"):
        find_candidates(model, ["Block", "Decoder"])


def test_bad_targets_type(model):
    with pytest.raises(ValueError, match=r"`targets` must be None or a list .* got \[.Block., 3\]"):
        find_candidates(model, ["Block", 3])


def test_no_repeated_list_asks_for_targets():
    with pytest.raises(ValueError, match="has none; pass `targets`.*0 \\(Linear\\)"):
        find_candidates(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))


def _conv_blocks() -> nn.Module:
    def block(norm: nn.Module) -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 3, 1), norm)

    return nn.ModuleList([block(nn.BatchNorm2d(3)), block(nn.GroupNorm(1, 3)), block(nn.BatchNorm2d(3))])


def test_blocks_with_running_stats_norms_are_candidates():
    assert find_candidates(_conv_blocks()) == ["0", "1", "2"]


class _EncoderDecoder(nn.Module):
    """Two stacks of different blocks, a list of bare heads, and lists nested inside blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Module()
        self.encoder.block = nn.ModuleList(_Stage() for _ in range(3))
        self.decoder = nn.Module()
        self.decoder.block = nn.ModuleList(nn.Sequential(nn.Linear(2, 2), nn.ReLU()) for _ in range(2))
        self.heads = nn.ModuleList(nn.Linear(2, 2) for _ in range(4))  # leaves: not a stack of blocks


class _Stage(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.ModuleList(nn.Sequential(nn.Linear(2, 2)) for _ in range(5))


def test_every_list_of_repeated_blocks_is_taken_and_logged(caplog):
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero"):
        names = find_candidates(_EncoderDecoder())
    assert names == [
        "encoder.block.0",
        "encoder.block.1",
        "encoder.block.2",
        "decoder.block.0",
        "decoder.block.1",
    ]
    assert "encoder.block (3 x _Stage), decoder.block (2 x Sequential)" in caplog.text


def test_targets_still_override_the_default():
    assert find_candidates(_EncoderDecoder(), ["encoder.block.*.inner.*"]) == [
        f"encoder.block.{i}.inner.{j}" for i in range(3) for j in range(5)
    ]


def test_names_are_stripped_of_wrapper_prefixes(model):
    compiled = torch.compile(model)
    assert find_candidates(compiled) == BLOCKS
    assert find_candidates(compiled, ["_orig_mod.transformer.h.0", "*.h.2"]) == [
        "transformer.h.0",
        "transformer.h.2",
    ]
