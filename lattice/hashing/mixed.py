"""Mixed-dimension embeddings (Ginart et al. 2021, "Mixed Dimension Embeddings with Application
to Memory-Efficient Recommendation Systems"): popular ids get wide rows, rare ids narrow ones.

The fitted map ranks the seen ids by their training count; the row space is those ranks, then
the unseen range (an unseen id: n + id mod oov_rows). `lattice.hashing.layout.mixed_layout`
cuts it into frequency blocks (the head at full width, up to 3 narrower tail blocks by the
α-power rule) within the parameter budget of a full-width table of the row budget. Each block is
its own EBC table; an id is a value of exactly one block's stream, and each narrower block's
pooled sum is projected to the feature width by its own d x w matrix. Projection is linear, so
the combined embedding of a bag is exactly the sum over its ids of each id's projected row.
"""

# no `from __future__ import annotations`: FX codegen and TorchScript need real annotation objects

from typing import List, Tuple

import numpy as np
import torch
from torch import nn

from lattice.config.schema import SparseFeature
from lattice.hashing.layout import MixedLayout, mixed_layout
from lattice.hashing.base import Compression, FittedLookup, TableSpec, _i64


def rank_lookup(m: dict) -> Tuple[FittedLookup, np.ndarray]:
    """A lookup into the popularity-ranked row space of a fitted mixed map, and each row's
    popularity (T,), descending. The rank is recomputed from `counts` (ties by id) so the
    blocks follow frequency whatever row numbering the fit used."""
    ids = _i64(m["ids"])
    counts = np.asarray(m["counts"], dtype=np.int64).reshape(-1)
    if counts.shape[0] != ids.numel():
        raise ValueError(f"the fitted mixed map has {ids.numel()} ids but {counts.shape[0]} counts; "
                         "run `lattice hashing fit CONFIG` again")
    order = np.argsort(-counts, kind="stable")  # ids are sorted, so ties keep id order
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0])
    n, oov_rows = int(ids.numel()), max(1, int(m.get("oov_rows", 1)))
    rarest = float(counts[order[-1]]) if n else 1.0
    popularity = np.concatenate([counts[order].astype(np.float64), np.full(oov_rows, rarest)])
    return FittedLookup(ids, torch.from_numpy(rank.astype(np.int64)), n, oov_rows, n + oov_rows), popularity


class MixedCompression(Compression):
    def __init__(self, feature: SparseFeature, rows: int, dim: int, fitted_map: dict):
        lookup, popularity = rank_lookup(fitted_map)
        layout: MixedLayout = mixed_layout(popularity, rows, dim, feature.mixed_alpha)
        name = feature.name
        bounds, widths = list(layout.bounds), list(layout.widths)
        super().__init__(name, dim, [TableSpec(f"{name}__b{k}", bounds[k + 1] - bounds[k], w) for k, w in enumerate(widths)])
        self.layout = layout
        self.lookup = lookup
        self.starts: List[int] = bounds[:-1]
        self.ends: List[int] = bounds[1:]
        self.folded = layout.folded
        self.last_start, self.last_rows = bounds[-2], bounds[-1] - bounds[-2]
        # the head is full width: no projection; narrower blocks get a d x w one each
        self.proj = nn.ModuleList([nn.Identity() if w == dim else nn.Linear(w, dim, bias=False) for w in widths])

    def forward(self, values: torch.Tensor, lengths: torch.Tensor) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        x = self.lookup(values)  # (N,) ranked rows in [0, T)
        if self.folded:  # rows past what the budget holds share the last block's rows
            x = torch.where(x >= self.last_start, torch.remainder(x - self.last_start, self.last_rows) + self.last_start, x)
        zero = torch.zeros(1, dtype=torch.int64)
        offsets = torch.cat([zero, torch.cumsum(lengths.to(torch.int64), dim=0)])  # (B+1,) bag starts in x
        values_out: List[torch.Tensor] = []
        lengths_out: List[torch.Tensor] = []
        for start, end in zip(self.starts, self.ends):
            inside = (x >= start) & (x < end)  # (N,)
            seen = torch.cat([zero, torch.cumsum(inside.to(torch.int64), dim=0)])  # (N+1,) block ids before each position
            values_out.append(x[inside] - start)  # bag order kept: the block's own jagged values
            lengths_out.append((seen[offsets[1:]] - seen[offsets[:-1]]).to(lengths.dtype))  # (B,) block ids per bag
        return values_out, lengths_out

    def combine(self, pooled: List[torch.Tensor]) -> torch.Tensor:
        out = pooled[0]  # (B, d): the head block
        i = 1
        for p in self.proj[1:]:
            out = out + p(pooled[i])  # (B, w_k) -> (B, d)
            i += 1
        return out

    def lookup_width(self) -> int:
        # an id reads one block's row: count the widest (the head)
        return max(t.dim for t in self.tables)
