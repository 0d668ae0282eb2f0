"""KJT -> KJT id remapping in front of the embedding tables.

A single-table hashing scheme is a module that maps raw int64 ids of a key into [0, rows) of its
table. 'none' and 'modulo' live here; vocab, learned and zch (lattice.hashing) are registered with
`register_remap(kind, factory)` like any other single-table scheme. Multi-table schemes (qr, mixed) are not remaps:
`lattice.hashing.modules.make_compression` builds every scheme's module for `SparseArch`.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lattice.config import PlatformConfig
from lattice.config.schema import SparseFeature

# factory(config, feature, rows, fitted map or None) -> nn.Module mapping a (N,) int64 id tensor
# into [0, rows) (a fitted scheme: into [0, the map's table_rows))
RemapFactory = Callable[[PlatformConfig, SparseFeature, int, "dict | None"], nn.Module]
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


register_remap("modulo", lambda config, f, rows, fitted_map: ModuloRemap(rows))


def _compressed(config: PlatformConfig, f: SparseFeature, rows: int, fitted_map: dict | None) -> nn.Module:
    # imported on use: lattice.hashing builds on this module, and lattice.models on lattice.hashing
    from lattice.hashing.modules import single_table_remap

    return single_table_remap(f, rows, fitted_map)


for _kind in ("vocab", "learned", "zch"):
    register_remap(_kind, _compressed)


def make_remap(config: PlatformConfig, feature: SparseFeature, rows: int, fitted_map: dict | None = None) -> nn.Module:
    """The id -> row module of a single-table scheme; `fitted_map`: the feature's fitted map for
    this row budget (vocab, learned)."""
    if feature.hashing == "none":
        # a scaled-down table cannot hold every raw id: re-hash into it
        return IdentityRemap(feature.name, rows) if rows >= feature.num_embeddings else ModuloRemap(rows)
    if feature.hashing not in _FACTORIES:
        raise ValueError(
            f"sparse feature {feature.name!r} uses hashing {feature.hashing!r}, which is not registered as a "
            f"single-table remap (available: none, {', '.join(sorted(_FACTORIES))}); multi-table schemes (qr, mixed) "
            "are built by lattice.hashing.modules.make_compression")
    return _FACTORIES[feature.hashing](config, feature, rows, fitted_map)


def table_capacity_notes(config: PlatformConfig, distinct_ids: dict[str, int] | None,
                         merged_ids: dict[str, int] | None = None) -> list[str]:
    """One line per 'modulo' feature whose table has fewer rows than the train split has ids: such
    ids share rows (and so embeddings); and per 'modulo' feature with fewer ids than rows whose
    ids still collide in many pairs (`lattice.hashing.collisions`). Learned and QR hashing are
    built for that; 'none' fails on an out-of-range id instead."""
    from lattice.hashing.collisions import NOTE_SHARE, collision_note, expected_colliding_pairs

    notes = []
    for f in config.features.sparse:
        n = (distinct_ids or {}).get(f.name, 0)
        if f.hashing == "modulo" and n > f.num_embeddings:
            notes.append(
                f"sparse feature {f.name!r}: {n:,} distinct ids in the train split share its {f.num_embeddings:,} "
                f"table rows ({n / f.num_embeddings:.1f} per row on average, about "
                f"{expected_colliding_pairs(n, f.num_embeddings):,.0f} colliding pairs); to share fewer, raise "
                f"features.sparse.{f.name}.num_embeddings to {n:,} or more in the config "
                f"(or train with --set features.sparse.{f.name}.num_embeddings={n}), or use hashing: learned")
        elif f.hashing == "modulo" and merged_ids is not None and f.name in merged_ids:
            merged = merged_ids[f.name]  # counted on the real ids: small integer ids never merge
            if merged >= max(1, NOTE_SHARE * n):
                notes.append(
                    f"sparse feature {f.name!r}: {merged:,} of its {n:,} distinct train-split ids share a row with another "
                    f"id under modulo {f.num_embeddings:,}, so they train one shared embedding; the ids fit the budget: "
                    f"`hashing: vocab` (features.sparse.{f.name}.hashing, then `lattice hashing fit CONFIG`) gives each its own row")
        elif (note := collision_note(f, n, f.num_embeddings)) is not None:
            notes.append(note)  # fewer ids than rows, yet hashing still merges many of them
    return notes


class KJTRemap(nn.Module):
    """Applies one remap module per key; the KJT layout (keys, lengths) is unchanged. SparseArch now
    goes through `lattice.hashing.modules.KJTCompress`, which also splits keys into sub-tables."""

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
