"""KJT -> KJT id remapping in front of the embedding tables.

Every hashing scheme is a module that maps raw int64 ids of each key into [0, rows) of its table.
'none' and 'modulo' live here; other schemes (QR, learned) register a factory with
`register_remap(kind, factory)` and are picked up by the same `SparseArch` without model changes.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lattice.config import PlatformConfig
from lattice.config.schema import SparseFeature

# factory(config, feature, rows) -> nn.Module mapping a (N,) int64 id tensor into [0, rows)
RemapFactory = Callable[[PlatformConfig, SparseFeature, int], nn.Module]
_FACTORIES: dict[str, RemapFactory] = {}


def register_remap(kind: str, factory: RemapFactory) -> None:
    _FACTORIES[kind] = factory


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


register_remap("modulo", lambda config, f, rows: ModuloRemap(rows))


def make_remap(config: PlatformConfig, feature: SparseFeature, rows: int) -> nn.Module:
    if feature.hashing == "none":
        # a scaled-down table cannot hold every raw id: re-hash into it
        return IdentityRemap(feature.name, rows) if rows >= feature.num_embeddings else ModuloRemap(rows)
    if feature.hashing not in _FACTORIES:
        raise ValueError(
            f"sparse feature {feature.name!r} uses hashing {feature.hashing!r}, which is not registered "
            f"(available: none, {', '.join(sorted(_FACTORIES))}); import the module that registers it "
            "(lattice.hashing) or use hashing: modulo")
    return _FACTORIES[feature.hashing](config, feature, rows)


def table_capacity_notes(config: PlatformConfig, distinct_ids: dict[str, int] | None) -> list[str]:
    """One line per 'modulo' feature whose table has fewer rows than the train split has ids: such
    ids share rows (and so embeddings). Learned and QR hashing are built for that; 'none' fails
    on an out-of-range id instead."""
    notes = []
    for f in config.features.sparse:
        n = (distinct_ids or {}).get(f.name, 0)
        if f.hashing == "modulo" and n > f.num_embeddings:
            notes.append(
                f"sparse feature {f.name!r}: {n:,} distinct ids in the train split share its {f.num_embeddings:,} "
                f"table rows ({n / f.num_embeddings:.1f} per row on average); to share fewer, raise "
                f"features.sparse.{f.name}.num_embeddings to {n:,} or more in the config "
                f"(or train with --set features.sparse.{f.name}.num_embeddings={n})")
    return notes


class KJTRemap(nn.Module):
    """Applies one remap module per key; the KJT layout (keys, lengths) is unchanged."""

    def __init__(self, keys: list[str], remaps: list[nn.Module]):
        super().__init__()
        self.keys = list(keys)
        self.remaps = nn.ModuleList(remaps)

    def forward(self, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
        if list(kjt.keys()) != self.keys:
            raise ValueError(f"sparse input keys {kjt.keys()} differ from the model's {self.keys}")
        per_key = kjt.values().split(kjt.length_per_key())
        values = torch.cat([m(v) for m, v in zip(self.remaps, per_key)]) if per_key else kjt.values()
        return KeyedJaggedTensor(keys=self.keys, values=values, lengths=kjt.lengths(), stride=kjt.stride())
