"""KJT -> KJT id remapping in front of the embedding tables.

A single-table hashing scheme is a module that maps raw int64 ids of a key into [0, rows) of its
table. Every scheme, single- or multi-table, lives in lattice.hashing and is looked up by name in
`lattice.hashing.registry`, whose `make_compression` builds each feature's module for `SparseArch`;
this module keeps the model-side helpers (capacity notes, the per-key `KJTRemap`).
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lattice.config import PlatformConfig

# The schemes themselves live in lattice.hashing (one module each, a name -> builder registry);
# re-exported here for the callers that build or register a single-table remap through models.
from lattice.hashing.registry import RemapBuilder as RemapFactory  # noqa: F401
from lattice.hashing.registry import make_remap, register_remap  # noqa: F401
from lattice.hashing.single import IdentityRemap, ModuloRemap  # noqa: F401


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
    goes through `lattice.hashing.base.KJTCompress`, which also splits keys into sub-tables."""

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
