"""The two schemes that need no fit and no extra state: `none` (ids are already table rows) and
`modulo` (id mod rows). Each is an id -> row module for one table."""

from __future__ import annotations

import torch
from torch import nn


class ModuloRemap(nn.Module):
    def __init__(self, rows: int):
        super().__init__()
        self.rows = rows

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (N,) -> (N,)
        return torch.remainder(ids, self.rows)


class IdentityRemap(nn.Module):
    """hashing 'none': ids are already table rows; an out-of-range id is a data or config error."""

    def __init__(self, name: str, rows: int):
        super().__init__()
        self.name, self.rows = name, rows

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.numel() and (int(ids.max()) >= self.rows or int(ids.min()) < 0):
            raise ValueError(
                f"sparse feature {self.name!r} has hashing 'none' but an id outside [0, {self.rows}) "
                f"(max {int(ids.max())}); raise its num_embeddings or use hashing: modulo")
        return ids
