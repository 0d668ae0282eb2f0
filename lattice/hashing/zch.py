"""Zero-collision hashing: TorchRec's managed-collision module in front of a plain table.

`torchrec.modules.mc_modules.MCHManagedCollisionModule` (LFU eviction) keeps the R - 1 most
frequent ids it has seen, each with a row of its own; the last row takes every other id. It
counts the ids of the training batches and, every `zch_eviction_interval` steps, evicts the
least frequent ids for more frequent newcomers (a newcomer starts from the row it inherits; the
table is not reset, which keeps the sharded tables and their fused optimizer untouched). Until
the first interval ends every id is on the last row.

Data-parallel ranks: every rank would profile only its own slice of the batch and the maps would
drift apart (DMP does not broadcast buffers), so in training each rank all-gathers the ids of
the global batch first and profiles those, in rank order: the maps stay identical on every rank.

The artifact has no managed-collision code: `ZCHRemap.frozen()` is a `FittedLookup` over the
module's sorted raw ids and their rows, the same arithmetic as the eager eval-mode lookup.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torchrec.modules.mc_modules import LFU_EvictionPolicy, MCHManagedCollisionModule
from torchrec.sparse.jagged_tensor import JaggedTensor

from lattice.hashing.base import FittedLookup, sorted_lookup


def global_ids(ids: torch.Tensor) -> torch.Tensor:
    """(n,) ids of this rank -> the ids of every rank, in rank order (unchanged on 1 rank).
    Collective: every rank of the training group calls it in the same step."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return ids
    world = dist.get_world_size()
    n = torch.tensor([ids.numel()], dtype=torch.int64)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n)
    width = max(1, max(int(s) for s in sizes))
    padded = torch.zeros(width, dtype=torch.int64)
    padded[: ids.numel()] = ids
    parts = [torch.empty(width, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat([p[: int(s)] for p, s in zip(parts, sizes)])


class ZCHRemap(nn.Module):
    """(N,) raw ids -> (N,) rows in [0, rows); profiles the ids (all ranks' in training) first."""

    def __init__(self, name: str, rows: int, eviction_interval: int):
        super().__init__()
        self.name, self.rows = name, rows
        self.mch = MCHManagedCollisionModule(zch_size=rows, device=torch.device("cpu"), eviction_policy=LFU_EvictionPolicy(),
                                             eviction_interval=eviction_interval, name=name)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.profile(ids)
        return sorted_lookup(ids, self.mch._mch_sorted_raw_ids, self.mch._mch_remapped_ids_mapping, self.rows - 1,
                             self.rows - 1, 1)

    @torch.no_grad()
    def profile(self, ids: torch.Tensor) -> None:
        everyone = global_ids(ids)
        if everyone.numel() == 0 and self.mch._input_history_buffer_size == -1:
            # the module sizes its history buffer from the first batch it profiles: not an empty one
            return
        self.mch.profile({self.name: JaggedTensor(values=everyone, lengths=torch.tensor([everyone.numel()], dtype=torch.int32))})

    def seen_ids(self) -> torch.Tensor:
        """The raw ids that have a row of their own now, sorted."""
        ids = self.mch._mch_sorted_raw_ids
        return ids[ids != torch.iinfo(torch.int64).max]

    def frozen(self) -> FittedLookup:
        """The current map as plain buffers, for the artifact (no TorchRec managed-collision code)."""
        return FittedLookup(self.mch._mch_sorted_raw_ids.clone(), self.mch._mch_remapped_ids_mapping.clone(), self.rows - 1,
                            1, self.rows)
