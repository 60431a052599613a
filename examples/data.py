"""Byte-level text data for the GPT example: no tokenizer, no download.

By default the text is the Python standard library's own ``.py`` sources (real text already on every
machine with Python), read in sorted order so every run sees the same bytes; or any text file the user
names. Each sample is a random window of ``block_size + 1`` bytes (input and next-byte targets), drawn
from a seeded generator so that runs are repeatable.

Example:
    >>> data = CharDataModule(block_size=8, batch_size=2, max_chars=10_000, train_samples=4, val_samples=2)
    >>> data.setup("fit")
    >>> x, y = next(iter(data.train_dataloader()))
    >>> tuple(x.shape), bool((x[:, 1:] == y[:, :-1]).all())
    ((2, 8), True)
"""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset


def stdlib_text_bytes(max_chars: int) -> bytes:
    """The standard library's top-level ``.py`` files, sorted by name, concatenated, cut at ``max_chars``.

    Example:
        >>> len(stdlib_text_bytes(1000))
        1000
    """
    stdlib_dir = Path(sysconfig.get_paths()["stdlib"])
    chunks: list[bytes] = []
    total_chars = 0
    for path in sorted(stdlib_dir.glob("*.py")):
        chunks.append(path.read_bytes() + b"\n")
        total_chars += len(chunks[-1])
        if total_chars >= max_chars:
            break
    return b"".join(chunks)[:max_chars]


def load_text_bytes(text_path: str | None, max_chars: int) -> torch.Tensor:
    """The training text as a 1-D ``uint8`` tensor: the file at ``text_path``, or the stdlib sources."""
    if text_path is None:
        raw = stdlib_text_bytes(max_chars)
    else:
        path = Path(text_path)
        if not path.is_file():
            raise ValueError(f"`text_path` must name an existing file, got {text_path!r}")
        raw = path.read_bytes()[:max_chars]
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


class RandomWindows(Dataset):
    """``num_samples`` windows at seeded random offsets of ``data``; item ``i`` is ``(x, y)``, y = x shifted."""

    def __init__(self, data: torch.Tensor, block_size: int, num_samples: int, seed: int) -> None:
        if data.numel() < block_size + 2:
            raise ValueError(
                f"the text must hold more than block_size + 1 = {block_size + 1} bytes, got {data.numel()}: "
                "raise `max_chars`, lower `val_fraction` or `block_size`, or use a longer `text_path`"
            )
        generator = torch.Generator().manual_seed(seed)
        self.data = data
        self.block_size = block_size
        self.starts = torch.randint(0, data.numel() - block_size - 1, (num_samples,), generator=generator)

    def __len__(self) -> int:
        return self.starts.numel()

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = int(self.starts[index])
        window = self.data[start : start + self.block_size + 1].long()  # (block_size + 1,)
        return window[:-1], window[1:]  # inputs (T,), next-byte targets (T,)


class CharDataModule(L.LightningDataModule):
    """Byte-level language-modelling data (vocabulary of 256) with a train/validation split.

    Args:
        text_path: A text file to train on; ``None`` uses the Python standard library's sources.
        block_size: Tokens (bytes) per sample; match the model's ``block_size``.
        batch_size: Samples per batch.
        max_chars: The most bytes of text to read.
        val_fraction: Share of the text, taken from its end, held out for validation.
        train_samples: Training windows per epoch (fixed, so epochs have the same length).
        val_samples: Validation windows.
        num_workers: DataLoader worker processes.
        seed: Seed for the window offsets.

    Raises:
        ValueError: On sizes that are not positive, or ``val_fraction`` outside (0, 1).
    """

    def __init__(
        self,
        text_path: str | None = None,
        block_size: int = 256,
        batch_size: int = 16,
        max_chars: int = 2_000_000,
        val_fraction: float = 0.1,
        train_samples: int = 8192,
        val_samples: int = 512,
        num_workers: int = 0,
        seed: int = 1337,
    ) -> None:
        super().__init__()
        sizes = {
            "block_size": block_size,
            "batch_size": batch_size,
            "max_chars": max_chars,
            "train_samples": train_samples,
            "val_samples": val_samples,
        }
        for name, value in sizes.items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"`val_fraction` must be in (0, 1), got {val_fraction!r}")
        self.save_hyperparameters()
        self.train_set: RandomWindows | None = None
        self.val_set: RandomWindows | None = None

    def setup(self, stage: str) -> None:
        hp = self.hparams
        text = load_text_bytes(hp.text_path, hp.max_chars)
        split = int(text.numel() * (1.0 - hp.val_fraction))
        self.train_set = RandomWindows(text[:split], hp.block_size, hp.train_samples, hp.seed)
        self.val_set = RandomWindows(text[split:], hp.block_size, hp.val_samples, hp.seed + 1)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)

    def _loader(self, dataset: RandomWindows | None, shuffle: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError("call `setup()` before asking for a dataloader")
        generator = torch.Generator().manual_seed(self.hparams.seed)
        return DataLoader(
            dataset,
            batch_size=self.hparams.batch_size,
            shuffle=shuffle,
            generator=generator,
            num_workers=self.hparams.num_workers,
        )


class PaddedWindows(RandomWindows):
    """``RandomWindows`` as a tokenizer with ``padding="max_length"`` gives them: each sample keeps a seeded
    random length of at least ``min_length`` tokens and is padded with ``pad_id`` after it.

    Items are dicts: ``input_ids``, ``attention_mask`` (0 on padding) and ``labels`` (-100 on padding).
    """

    def __init__(
        self,
        data: torch.Tensor,
        block_size: int,
        num_samples: int,
        seed: int,
        min_length: int,
        pad_id: int = 0,
    ) -> None:
        super().__init__(data, block_size, num_samples, seed)
        generator = torch.Generator().manual_seed(seed + 2)
        self.lengths = torch.randint(min_length, block_size + 1, (num_samples,), generator=generator)
        self.pad_id = pad_id

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens, _ = super().__getitem__(index)
        mask = (torch.arange(self.block_size) < self.lengths[index]).long()
        return {
            "input_ids": tokens.masked_fill(mask == 0, self.pad_id),
            "attention_mask": mask,
            "labels": tokens.masked_fill(mask == 0, -100),
        }


class PaddedCharDataModule(CharDataModule):
    """``CharDataModule`` with padded dict batches for Hugging Face models (see :class:`PaddedWindows`).

    Args:
        min_length: the shortest sample before padding (tokens); the rest is drawn up to ``block_size``.
        **kwargs: the arguments of :class:`CharDataModule`.

    Example:
        >>> data = PaddedCharDataModule(block_size=8, batch_size=2, max_chars=10_000, train_samples=4,
        ...                             val_samples=2, min_length=4)
        >>> data.setup("fit")
        >>> batch = next(iter(data.train_dataloader()))
        >>> sorted(batch), tuple(batch["input_ids"].shape), int(batch["attention_mask"].sum()) >= 8
        (['attention_mask', 'input_ids', 'labels'], (2, 8), True)
    """

    def __init__(self, min_length: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(min_length, int) or not 1 <= min_length <= self.hparams.block_size:
            raise ValueError(
                f"`min_length` must be an integer in [1, block_size={self.hparams.block_size}], got {min_length!r}"
            )
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        hp = self.hparams
        text = load_text_bytes(hp.text_path, hp.max_chars)
        split = int(text.numel() * (1.0 - hp.val_fraction))
        windows = (hp.block_size, hp.train_samples, hp.seed, hp.min_length)
        self.train_set = PaddedWindows(text[:split], *windows)
        self.val_set = PaddedWindows(text[split:], hp.block_size, hp.val_samples, hp.seed + 1, hp.min_length)
