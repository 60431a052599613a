"""A nanoGPT-style GPT as a LightningModule, in one readable file.

Follows karpathy/nanoGPT ``model.py``: a config dataclass, causal self-attention, an MLP, a ``Block``
repeated ``n_layer`` times in an ``nn.ModuleList`` at ``transformer.h``, and a language-model head tied
to the token embedding. The ``nn.Module`` parts (``GPTConfig``, ``Block``, ``Transformer``) need no
Trainer; ``GPT`` adds the training loop pieces Lightning calls. One addition to nanoGPT: ``mlp_ratios``
can give each block its own MLP width, so that blocks differ in activation memory and recompute time
(``configs/gpt-mixed-cpu.yaml``).

Example:
    >>> import torch
    >>> model = GPT(block_size=8, n_layer=2, n_head=2, n_embd=16)
    >>> idx = torch.randint(0, 256, (3, 8))
    >>> logits, loss = model(idx, targets=idx)
    >>> tuple(logits.shape), loss.dim()
    ((3, 8, 256), 0)
    >>> [name for name, _ in model.named_modules() if name.startswith("transformer.h.")][:2]
    ['transformer.h.0', 'transformer.h.0.ln_1']
    >>> mixed = GPT(block_size=8, n_layer=2, n_head=2, n_embd=16, mlp_ratios=[1, 8])  # MLP widths per block
    >>> [block.mlp.c_fc.out_features for block in mixed.transformer.h]
    [16, 128]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GPTConfig:
    """Sizes of the model; the defaults are a small CPU-sized GPT.

    Example:
        >>> GPTConfig(n_layer=3, mlp_ratios=[1, 8, 2]).mlp_ratios  # kept as a tuple
        (1.0, 8.0, 2.0)
        >>> GPTConfig(n_layer=3, mlp_ratios=[1, 8])
        Traceback (most recent call last):
        ...
        ValueError: `mlp_ratios` must have one ratio per block (n_layer=3), got 2: [1, 8]
    """

    block_size: int = 256
    """Context length: the most tokens the model attends over."""
    vocab_size: int = 256
    """Number of token ids; 256 covers every byte (the example's data is byte-level)."""
    n_layer: int = 4
    """Number of transformer blocks."""
    n_head: int = 4
    """Attention heads per block; must divide ``n_embd``."""
    n_embd: int = 128
    """Width of the residual stream."""
    dropout: float = 0.0
    """Dropout probability on attention weights and residual branches (0 turns it off)."""
    bias: bool = True
    """Biases in Linear and LayerNorm layers (False is slightly faster, as in GPT-2 follow-ups)."""
    mlp_ratios: tuple[float, ...] | None = None
    """Each block's MLP hidden width as a multiple of ``n_embd`` (rounded to whole units), one per block;
    None = 4 for every block, as in GPT-2."""

    def __post_init__(self) -> None:
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"`n_embd` must be a multiple of `n_head`, got n_embd={self.n_embd}, n_head={self.n_head}: "
                "change one of them"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1), got {self.dropout!r}")
        if self.mlp_ratios is not None:
            self.mlp_ratios = _checked_mlp_ratios(self.mlp_ratios, self.n_layer, self.n_embd)

    def mlp_ratio(self, layer: int) -> float:
        """Block ``layer``'s MLP hidden width as a multiple of ``n_embd`` (4, as in GPT-2, by default)."""
        return 4.0 if self.mlp_ratios is None else self.mlp_ratios[layer]


def _checked_mlp_ratios(ratios: object, n_layer: int, n_embd: int) -> tuple[float, ...]:
    """``ratios`` as a tuple of floats, if it holds ``n_layer`` ratios that each give a hidden layer."""
    if isinstance(ratios, (str, bytes)) or not hasattr(ratios, "__len__"):
        raise ValueError(f"`mlp_ratios` must be a list of {n_layer} positive numbers or None, got {ratios!r}")
    if len(ratios) != n_layer:
        raise ValueError(
            f"`mlp_ratios` must have one ratio per block (n_layer={n_layer}), got {len(ratios)}: {list(ratios)}"
        )
    for ratio in ratios:
        is_number = isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and math.isfinite(ratio)
        if not is_number or round(ratio * n_embd) < 1:
            raise ValueError(
                f"`mlp_ratios` must hold positive numbers that give at least one hidden unit "
                f"(ratio x n_embd={n_embd} >= 0.5), got {ratio!r} in {list(ratios)}"
            )
    return tuple(float(ratio) for ratio in ratios)


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where each position sees only itself and earlier positions."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v at once
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()  # batch, sequence length, embedding width
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        dropout_p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C): heads side by side again
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward network, ``ratio`` times wider in the middle (4 in GPT-2)."""

    def __init__(self, config: GPTConfig, ratio: float = 4.0) -> None:
        super().__init__()
        hidden = round(ratio * config.n_embd)  # H = 4C in GPT-2
        self.c_fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.gelu(self.c_fc(x))  # (B, T, H)
        return self.dropout(self.c_proj(x))  # (B, T, C)


class Block(nn.Module):
    """One transformer block: pre-norm attention then pre-norm MLP, each on a residual branch."""

    def __init__(self, config: GPTConfig, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config, mlp_ratio)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))  # (B, T, C)
        return x + self.mlp(self.ln_2(x))  # (B, T, C)


class Transformer(nn.Module):
    """Token and position embeddings, ``n_layer`` blocks and a final LayerNorm (no output head).

    Example:
        >>> trunk = Transformer(GPTConfig(block_size=4, n_layer=1, n_head=1, n_embd=8))
        >>> trunk(torch.zeros(2, 4, dtype=torch.long)).shape
        torch.Size([2, 4, 8])
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.block_size = config.block_size
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)  # token embedding
        self.wpe = nn.Embedding(config.block_size, config.n_embd)  # position embedding
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList([Block(config, config.mlp_ratio(i)) for i in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.size()
        if T > self.block_size:
            raise ValueError(f"sequence length must be at most block_size={self.block_size}, got {T}")
        pos = torch.arange(T, dtype=torch.long, device=idx.device)  # (T,)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.h:
            x = block(x)  # (B, T, C)
        return self.ln_f(x)  # (B, T, C)


def init_weights(model: nn.Module, n_layer: int) -> None:
    """GPT-2 initialisation: N(0, 0.02), zero biases, residual projections scaled by 1/sqrt(2 n_layer)."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
    for name, param in model.named_parameters():
        if name.endswith("c_proj.weight"):
            nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))


class GPT(L.LightningModule):
    """GPT language model trained by Lightning: next-token cross-entropy, AdamW.

    The arguments are plain typed values so that LightningCLI can read them from YAML
    (``model: class_path: examples.gpt.GPT``, ``init_args: {n_layer: 4, ...}``).

    Args:
        block_size: Context length in tokens.
        vocab_size: Number of token ids (256 for bytes).
        n_layer: Number of transformer blocks.
        n_head: Attention heads per block; must divide ``n_embd``.
        n_embd: Width of the residual stream.
        dropout: Dropout probability (0 turns it off).
        bias: Biases in Linear and LayerNorm layers.
        mlp_ratios: Each block's MLP hidden width as a multiple of ``n_embd``, one per block
            (``n_layer`` of them); ``None`` = 4 for every block, as in GPT-2.
        learning_rate: AdamW learning rate.
        weight_decay: AdamW weight decay, applied to matrices and embeddings only.
        betas: AdamW betas.
    """

    def __init__(
        self,
        block_size: int = 256,
        vocab_size: int = 256,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 128,
        dropout: float = 0.0,
        bias: bool = True,
        mlp_ratios: list[float] | None = None,
        learning_rate: float = 1e-3,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.config = GPTConfig(block_size, vocab_size, n_layer, n_head, n_embd, dropout, bias, mlp_ratios)
        self.transformer = Transformer(self.config)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # weight tying: one matrix, two uses
        init_weights(self, n_layer)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return logits ``(B, T, vocab_size)`` and, given targets ``(B, T)``, the mean cross-entropy."""
        logits = self.lm_head(self.transformer(idx))  # (B, T, vocab_size)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_model(self) -> None:
        """Under ``ModelParallelStrategy`` (FSDP2), shard each block, then the whole model, over the
        data-parallel mesh, as Lightning's docs do; under any other strategy there is nothing to do."""
        if self.device_mesh is None:
            return
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for block in self.transformer.h:
            fully_shard(block, mesh=mesh)  # one unit per block: gathered for its forward and backward only
        fully_shard(self, mesh=mesh)  # the root: embeddings, final norm, the tied head

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        idx, targets = batch  # (B, T), (B, T)
        _, loss = self(idx, targets)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        idx, targets = batch  # (B, T), (B, T)
        _, loss = self(idx, targets)
        self.log("val_loss", loss, prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """AdamW, decaying 2-D weights (matrices, embeddings) but not biases and LayerNorm gains."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": self.hparams.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=self.hparams.learning_rate, betas=tuple(self.hparams.betas))

    def num_parameters(self) -> int:
        """Number of distinct parameters (the tied embedding counted once).

        Example:
            >>> GPT(block_size=8, n_layer=1, n_head=1, n_embd=8).num_parameters()  # 2048 token + 64 position + 872 block + 16 final norm
            3000
        """
        return sum(p.numel() for p in self.parameters())
