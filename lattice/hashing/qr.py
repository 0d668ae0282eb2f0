"""Quotient-remainder embeddings (Shi et al. 2020, "Compositional Embeddings Using
Complementary Partitions"): two small tables instead of one big one.

An id is first reduced to the id space [0, M), M = q·r: with a fitted vocab map for the feature
(optional) through that map, then mod M; otherwise id mod M (a non-negative remainder, so
negative and huge ids are in range). Then x -> (x // r, x mod r) picks a row of the quotient
table (q rows) and of the remainder table (r rows): two ids below M never share both, so every
id of the id space keeps a distinct embedding with q + r = R rows (the row budget) instead of M.

Combine (`qr_combine`): `mul` (element-wise product, the paper's best), `add`, or `concat` of
two tables that split the width d (even widths where d allows: 8 -> 4 + 4, 6 -> 4 + 2).
Pooling: each table is SUM-pooled over the bag first, then the bag's two sums are combined.
`add` and `concat` are therefore exactly the sum over the bag of each id's combined embedding;
`mul` is that only for bags of at most one id (every feature the loaders produce today), and
for longer bags the product of the two sums (it adds the cross terms q(a)·r(b) of different
ids a, b).
"""

# no `from __future__ import annotations`: FX codegen and TorchScript need real annotation objects

import functools
import math
from typing import List, Optional, Tuple

import torch
from torch import nn

from lattice.config.schema import SparseFeature
from lattice.hashing.layout import qr_split, qr_widths
from lattice.hashing.base import Compression, TableSpec, lookup_from_map


def _near_one(weight: torch.Tensor, half_width: float) -> torch.Tensor:
    """Init of the `mul` remainder table: 1 ± half_width, so that at the start q ⊙ r is about
    the quotient row alone (a plain hashed embedding) instead of a product of two small numbers,
    whose gradients would be tiny."""
    with torch.no_grad():
        return weight.uniform_(1.0 - half_width, 1.0 + half_width)


class QRCompression(Compression):
    def __init__(self, feature: SparseFeature, rows: int, dim: int, fitted_map: Optional[dict] = None):
        q, r = qr_split(feature, rows)
        dq, dr = qr_widths(feature, dim)
        name = feature.name
        r_init = functools.partial(_near_one, half_width=math.sqrt(1.0 / r)) if feature.qr_combine == "mul" else None
        super().__init__(name, dq + dr if feature.qr_combine == "concat" else dim,
                         [TableSpec(f"{name}__q", q, dq), TableSpec(f"{name}__r", r, dr, r_init)])
        self.q_rows, self.r_rows, self.id_space = q, r, q * r
        self.mode: str = feature.qr_combine
        # a vocab fit (if the feature has one) first gives each frequent id its own index
        self.pre: nn.Module = lookup_from_map(feature, fitted_map, rows, cap_to_budget=False) if fitted_map else nn.Identity()

    def forward(self, values: torch.Tensor, lengths: torch.Tensor) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        x = torch.remainder(self.pre(values), self.id_space)  # (N,) in [0, q·r)
        quotient = torch.div(x, self.r_rows, rounding_mode="floor")  # (N,) in [0, q)
        remainder = torch.remainder(x, self.r_rows)  # (N,) in [0, r)
        return [quotient, remainder], [lengths, lengths]

    def combine(self, pooled: List[torch.Tensor]) -> torch.Tensor:
        pq, pr = pooled[0], pooled[1]  # (B, dq), (B, dr)
        if self.mode == "mul":
            return pq * pr
        if self.mode == "add":
            return pq + pr
        return torch.cat([pq, pr], dim=1)  # (B, dq + dr)
