"""One training batch of a config's data module, read the cheap way (no download, no workers)."""

from __future__ import annotations

import warnings
from typing import Any

from torch.utils.data import IterableDataset

from lightning_ckpt.lightning.run_spec import ClassSpec

__all__ = ["first_batch"]


def first_batch(data: ClassSpec) -> Any:
    """One training batch of the data module: ``setup("fit")``, then the first batch, without workers.

    Example:
        >>> arguments = {"block_size": 8, "batch_size": 2, "max_chars": 1000}
        >>> spec = ClassSpec("examples.data.CharDataModule", arguments)
        >>> [tuple(t.shape) for t in first_batch(spec)]
        [(2, 8), (2, 8)]
    """
    datamodule = data.instantiate()
    datamodule.setup("fit")
    with warnings.catch_warnings():  # a config's num_workers may exceed this machine's cores: none start
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        loader = datamodule.train_dataloader()
        sampler = getattr(loader, "batch_sampler", None)
        if sampler is None or isinstance(loader.dataset, IterableDataset):
            return next(iter(loader))
        return loader.collate_fn([loader.dataset[i] for i in next(iter(sampler))])
