"""Requests -> rows in the training-set layout (consolidated columns + aggregates), so the served
artifact encodes them with the training encoder and scores them exactly like offline rows.

Raw ids go through the same `stable_id` as consolidation; an absent sparse feature is null and
an absent dense feature is 0.0 with `<dense>_present = 0`, as for a domain that never logs it.
`request_columns` builds numpy columns for `RowEncoder.assemble` (the per-request path: no
Arrow table or pandas frame); `request_table` is the same rows as an Arrow table, for tools
and tests that work with tables.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from lattice.config import PlatformConfig
from lattice.data import schema as S
from lattice.serving.requests import PredictRequest


@dataclass
class RequestColumns:
    example_id: np.ndarray  # str
    domain: np.ndarray  # str
    sparse: dict[str, tuple[np.ndarray, np.ndarray]]  # column -> (int64 ids, bool present)
    dense: dict[str, np.ndarray]  # column -> float64 (presence flags and aggregates included)

    def __len__(self) -> int:
        return len(self.domain)


def _ids(values: list) -> tuple[np.ndarray, np.ndarray]:
    """Raw sparse values -> (int64 ids, present). An int is its own id (`stable_id(str(i)) == i`),
    so only strings are hashed."""
    n = len(values)
    ids = np.zeros(n, np.int64)
    present = np.ones(n, bool)
    for i, v in enumerate(values):
        if type(v) is int:
            ids[i] = v
        elif v is None or (type(v) is str and S.is_null_like(v)):  # as the feature stage reads it
            present[i] = False
        else:
            ids[i] = S.stable_id(str(v))
    return ids, present


def request_columns(config: PlatformConfig, reqs: list, aggregates: dict[str, np.ndarray]) -> RequestColumns:
    """`reqs`: anything with PredictRequest's attributes (the pydantic model or the wire struct)."""
    n = len(reqs)
    entity = {f.column for f in config.entity_features}
    sparse = {}
    for c in S.sparse_columns(config):
        sparse[c] = _ids([r.entities[c] for r in reqs] if c in entity else [r.features.get(c) for r in reqs])
    dense = {}
    for c in S.dense_columns(config):
        vals = [r.features.get(c) for r in reqs]
        present = np.array([v is not None for v in vals], np.float64)
        dense[c] = np.array([0.0 if v is None else v for v in vals], np.float64)
        dense[S.present_column(c)] = present
    for c in S.aggregate_columns(config):
        dense[c] = np.asarray(aggregates[c], np.float64) if c in aggregates else np.zeros(n)
    return RequestColumns(
        example_id=np.array([r.request_id or f"req{i}" for i, r in enumerate(reqs)], dtype=str),
        domain=np.array([r.domain for r in reqs], dtype=str),
        sparse=sparse, dense=dense,
    )


def request_table(config: PlatformConfig, reqs: list[PredictRequest], aggregates: dict[str, np.ndarray]) -> pa.Table:
    rc = request_columns(config, reqs, aggregates)
    cols: dict[str, pa.Array] = {"example_id": pa.array(rc.example_id.tolist(), pa.string()),
                                 "domain": pa.array(rc.domain.tolist(), pa.string())}
    for c, (ids, present) in rc.sparse.items():
        cols[c] = pa.array(ids, pa.int64(), mask=~present)
    flags = {S.present_column(c) for c in S.dense_columns(config)}
    for c, v in rc.dense.items():
        cols[c] = pa.array(v.astype(np.int8), pa.int8()) if c in flags else pa.array(v, pa.float64())
    return pa.table(cols)
