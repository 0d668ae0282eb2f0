"""The base of every per-feature compression module in front of the EmbeddingBagCollection.

One interface for every `hashing` scheme (`Compression`): a feature's bags (values (N,), lengths
(B,)) become one or more streams, each a (values, lengths) pair keyed by a sub-key that names one
EBC table; after SUM pooling, `combine` turns the sub-keys' pooled (B, w_k) embeddings back into
the feature's (B, d) embedding. Single-table schemes (none, modulo, vocab, learned, zch) are a
remap of the ids (`RemapCompression`): one stream keyed by the feature's own name, combine is the
identity, so the EBC sees exactly the KJT it saw before compression existed. Multi-table schemes
(`qr`, `mixed`) emit several streams and combine them (lattice.hashing.qr, lattice.hashing.mixed).

Every module here is FX-traceable and its traced graph scriptable (no data-dependent Python
branches): the exported TorchScript artifact runs the same code on the same buffers. The one
exception, zch, trains a TorchRec managed-collision module and becomes a frozen lookup in the
artifact (`ZCHRemap.frozen`).

This module holds only what every scheme shares (the interface, the fitted-map lookup and its
checks); each scheme is a small module that imports this one, and `lattice.hashing.registry`
maps scheme names to their builders.
"""

# no `from __future__ import annotations`: FX codegen and TorchScript need real annotation objects

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple, cast

import numpy as np
import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lattice.config.schema import SparseFeature

FIT_COMMAND = "lattice hashing fit CONFIG"


@dataclass(frozen=True)
class TableSpec:
    """One EBC table a compression module reads: its sub-key (the KJT key and, as `t_<sub_key>`,
    the table name), rows, width and an optional weight initializer (None: TorchRec's uniform)."""

    sub_key: str
    rows: int
    dim: int
    init_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None


class Compression(nn.Module):
    """A feature's ids -> streams for the EBC, and pooled sub-key embeddings -> (B, out_dim)."""

    def __init__(self, name: str, out_dim: int, tables: List[TableSpec]):
        super().__init__()
        self.name = name
        self.out_dim = out_dim
        self.tables = list(tables)  # a Python list: not module state
        self.sub_keys: List[str] = [t.sub_key for t in tables]

    def forward(self, values: torch.Tensor, lengths: torch.Tensor) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        """(N,) ids and (B,) bag lengths -> per sub-key (values, lengths), in `sub_keys` order."""
        raise NotImplementedError

    def combine(self, pooled: List[torch.Tensor]) -> torch.Tensor:
        """Per sub-key pooled (B, w_k) -> (B, out_dim)."""
        raise NotImplementedError

    def lookup_width(self) -> int:
        """Embedding values one id reads (the FLOP-count convention of lattice.models.cost)."""
        return sum(t.dim for t in self.tables)


class RemapCompression(Compression):
    """Single-table schemes: a remap of ids into [0, rows) of one table named after the feature."""

    def __init__(self, name: str, rows: int, dim: int, remap: nn.Module):
        super().__init__(name, dim, [TableSpec(name, rows, dim)])
        self.remap = remap

    def forward(self, values: torch.Tensor, lengths: torch.Tensor) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        return [self.remap(values)], [lengths]

    def combine(self, pooled: List[torch.Tensor]) -> torch.Tensor:
        return pooled[0]


def sorted_lookup(values: torch.Tensor, ids: torch.Tensor, rows_of: torch.Tensor, last: int, oov_start: int,
                  oov_rows: int) -> torch.Tensor:
    """(N,) raw ids -> (N,) rows: an id equal to ids[i] (ids sorted ascending, last = len - 1)
    gets rows_of[i], any other id oov_start + (id mod oov_rows), a non-negative remainder, so
    negative and huge ids land in the range too."""
    pos = torch.searchsorted(ids, values).clamp(max=last)  # (N,) first index with ids[pos] >= id
    hit = ids[pos] == values
    return torch.where(hit, rows_of[pos].to(torch.int64), torch.remainder(values, oov_rows) + oov_start)


class FittedLookup(nn.Module):
    """A fitted id map as buffers (so the TorchScript artifact carries it): sorted ids, their
    rows and the out-of-vocabulary range. Non-persistent: the saved blob's `hashing` dict is the
    source of truth and rebuilds them; the state dict stays the tables' and layers' weights."""

    ids: torch.Tensor
    rows_of: torch.Tensor

    def __init__(self, ids: torch.Tensor, rows_of: torch.Tensor, oov_start: int, oov_rows: int, rows: int):
        super().__init__()
        if ids.numel() == 0:
            # one sentinel entry mapped where the out-of-vocabulary rule sends it: same map, and
            # searchsorted always has an element to land on
            ids = torch.zeros(1, dtype=torch.int64)
            rows_of = torch.full((1,), oov_start, dtype=torch.int64)
        self.register_buffer("ids", ids.to(torch.int64).contiguous(), persistent=False)
        # rows fit int32 (a table has fewer than 2^31 rows): 12 bytes per mapped id in the
        # artifact instead of 16
        self.register_buffer("rows_of", rows_of.to(torch.int32).contiguous(), persistent=False)
        self.last = int(ids.numel()) - 1
        self.oov_start, self.oov_rows, self.rows = int(oov_start), int(oov_rows), int(rows)

    def forward(self, values: torch.Tensor) -> torch.Tensor:  # (N,) -> (N,) in [0, rows)
        return sorted_lookup(values, self.ids, self.rows_of, self.last, self.oov_start, self.oov_rows)


class KJTCompress(nn.Module):
    """KJT (one key per sparse feature) -> KJT (one key per sub-key, i.e. per EBC table)."""

    def __init__(self, keys: List[str], features: List[Compression]):
        super().__init__()
        self.keys: List[str] = list(keys)
        self.features = nn.ModuleList(features)
        self.sub_keys: List[str] = [k for m in features for k in m.sub_keys]
        if len(set(self.sub_keys)) != len(self.sub_keys):
            raise ValueError(f"sparse feature names collide with compressed sub-tables: {self.sub_keys}; rename the feature")

    def forward(self, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
        if isinstance(kjt, KeyedJaggedTensor) and kjt.keys() != self.keys:  # eager only: a traced KJT is a proxy
            raise ValueError(f"sparse input keys {kjt.keys()} differ from the model's {self.keys}")
        parts = torch.split(kjt.values(), kjt.length_per_key())  # one (n_f,) id tensor per feature
        lengths = kjt.lengths().view(len(self.keys), -1)  # (F, B)
        values_out: List[torch.Tensor] = []
        lengths_out: List[torch.Tensor] = []
        i = 0
        for m in self.features:  # indexed, not zipped: the traced graph unrolls it
            vs, ls = m(parts[i], lengths[i])
            values_out += vs
            lengths_out += ls
            i += 1
        return KeyedJaggedTensor(keys=self.sub_keys, values=torch.cat(values_out), lengths=torch.cat(lengths_out),
                                 stride=kjt.stride())

    def combine(self, pooled: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Sub-key -> (B, w) pooled embeddings to feature -> (B, d_f)."""
        out: Dict[str, torch.Tensor] = {}
        for m in self.features:
            c = cast(Compression, m)
            out[c.name] = c.combine([pooled[k] for k in c.sub_keys])
        return out

    def compressions(self) -> List[Compression]:
        """The per-feature modules, in feature order."""
        return [cast(Compression, m) for m in self.features]


# ---------------------------------------------------------------- fitted maps


def fitted_map(feature: SparseFeature, rows: int, fitted: Optional[dict]) -> Optional[dict]:
    """The feature's fitted map for a row budget, or None. `fitted`: feature -> {budget: map}
    (budgets as ints, or as strings after a JSON round trip)."""
    per_budget = (fitted or {}).get(feature.name) or {}
    m = per_budget.get(rows, per_budget.get(str(rows)))
    return m


def require_fitted(feature: SparseFeature, rows: int, fitted: Optional[dict]) -> dict:
    m = fitted_map(feature, rows, fitted)
    if m is None:
        from lattice.hashing.store import FitMissingError

        have = sorted(((fitted or {}).get(feature.name) or {}).keys(), key=str)
        raise FitMissingError(
            f"sparse feature {feature.name!r} uses hashing {feature.hashing!r}, which needs a fitted id map for its "
            f"{rows:,}-row table (fitted budgets: {have or 'none'}); run `{FIT_COMMAND}` after the features stage, "
            "then train again")
    if m.get("scheme") not in (None, feature.hashing):
        raise ValueError(f"sparse feature {feature.name!r}: the fitted map is for hashing {m.get('scheme')!r}, the "
                         f"config says {feature.hashing!r}; run `{FIT_COMMAND}` again")
    return m


def _i64(a) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        return a.detach().to(torch.int64).reshape(-1).clone()
    return torch.from_numpy(np.asarray(a, dtype=np.int64).reshape(-1).copy())


def lookup_from_map(feature: SparseFeature, m: dict, rows: int, cap_to_budget: bool = True) -> FittedLookup:
    """A `FittedLookup` from a fitted map dict (the contract of lattice.hashing.fit), checked:
    every id lands in [0, table_rows) and, unless `cap_to_budget` is false, table_rows <= rows."""
    ids, rows_of = _i64(m["ids"]), _i64(m["rows_of"])
    table_rows, oov_start, oov_rows = int(m["table_rows"]), int(m["oov_start"]), int(m["oov_rows"])
    where = f"sparse feature {feature.name!r}: the fitted {feature.hashing} map"
    problems = []
    if ids.numel() != rows_of.numel():
        problems.append(f"has {ids.numel()} ids but {rows_of.numel()} rows_of")
    elif ids.numel() and not bool((ids[1:] > ids[:-1]).all()):
        problems.append("has ids that are not sorted and unique")
    if ids.numel() and rows_of.numel() == ids.numel() and (int(rows_of.min()) < 0 or int(rows_of.max()) >= table_rows):
        problems.append(f"maps ids outside its {table_rows:,} table rows")
    if oov_rows < 1 or oov_start < 0 or oov_start + oov_rows > table_rows:
        problems.append(f"has an out-of-vocabulary range [{oov_start}, {oov_start + oov_rows}) outside its {table_rows:,} rows")
    if cap_to_budget and table_rows > rows:
        problems.append(f"has {table_rows:,} rows, more than the {rows:,}-row budget it was fitted for")
    if problems:
        raise ValueError(f"{where} {'; '.join(problems)}; run `{FIT_COMMAND}` again")
    return FittedLookup(ids, rows_of, oov_start, oov_rows, table_rows)


def compressions(model: nn.Module) -> List[Compression]:
    """Every per-feature compression module of a model."""
    return [m for m in model.modules() if isinstance(m, Compression)]


def lookup_buffer_bytes(model: nn.Module) -> int:
    """Bytes of the id-lookup state the compression modules hold (fitted maps, managed-collision
    ids): not parameters, but the artifact carries them."""
    return sum(b.numel() * b.element_size() for c in compressions(model) for b in c.buffers())
