"""The Mods (ModelSize `bias`, `block_norm`, `activation`): small changes to the dense networks
that keep FP8 GEMM operands in range and drop operands FP8 GEMMs would have to carry. The
defaults (`bias: all`, `block_norm: 0`, `activation: relu`) build the network unchanged."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lattice.config.schema import ModelSize


class BlockRMSNorm(nn.Module):
    """Parameter-free grouped RMS normalisation: the last dim is cut into fixed blocks of `block`
    features and each block is divided by its own root mean square, so every block of the next
    GEMM's input has RMS 1 whatever the layer's scale (FP8's range is about 2^±8 around its
    scale). A width that is not a multiple of `block` ends in one shorter block, normalised over
    its own features (no padding; a width below `block` is one block)."""

    def __init__(self, width: int, block: int, eps: float = 1e-6):
        super().__init__()
        if block < 1:
            raise ValueError(f"block_norm block must be at least 1, got {block}")
        self.width, self.block, self.eps = width, block, eps
        self.full = (width // block) * block  # features in whole blocks

    def _norm(self, x: torch.Tensor, block: int) -> torch.Tensor:  # (..., W) -> (..., W), W % block == 0
        g = x.unflatten(-1, (-1, block))  # (..., W/block, block)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        return g.flatten(-2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., width) -> (..., width)
        if self.full == self.width:
            return self._norm(x, self.block)
        if self.full == 0:
            return self._norm(x, self.width)
        head, tail = x[..., : self.full], x[..., self.full:]
        return torch.cat([self._norm(head, self.block), self._norm(tail, self.width - self.full)], dim=-1)

    def extra_repr(self) -> str:
        return f"width={self.width}, block={self.block}"


@dataclass(frozen=True)
class Mods:
    """What a ModelSize's Mods ask of every layer built from it."""

    bias: bool = True
    """Biases in every layer except a head's prediction layer (`bias: all`); false for `final`."""
    block_norm: int = 0
    activation: str = "relu"

    @classmethod
    def of(cls, size: ModelSize | None) -> "Mods":
        if size is None:
            return cls()
        return cls(bias=size.bias == "all", block_norm=size.block_norm, activation=size.activation)

    def act(self) -> nn.Module:
        return nn.Hardswish() if self.activation == "hardswish" else nn.ReLU()

    def after_hidden(self, width: int) -> list[nn.Module]:
        """The activation and (with block_norm) the block norm after a hidden layer of `width`:
        the norm comes last, so it is the next GEMM's input that has unit RMS per block."""
        return [self.act()] + ([BlockRMSNorm(width, self.block_norm)] if self.block_norm else [])
