"""Requests -> Arrow rows in the training-set layout (consolidated columns + aggregates), so the
served artifact encodes them with the training encoder and scores them exactly like offline rows.

Raw ids go through the same `stable_id` as consolidation; an absent sparse feature is null and
an absent dense feature is 0.0 with `<dense>_present = 0`, as for a domain that never logs it.
Built column by column in Arrow (no pandas frame): this runs on every request.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from lattice.config import PlatformConfig
from lattice.data import schema as S
from lattice.serving.requests import PredictRequest


def _sparse_id(v: object) -> int | None:
    return None if v is None else S.stable_id(str(v))


def request_table(config: PlatformConfig, reqs: list[PredictRequest], aggregates: dict[str, np.ndarray]) -> pa.Table:
    n = len(reqs)
    cols: dict[str, pa.Array] = {
        "example_id": pa.array([r.request_id or f"req{i}" for i, r in enumerate(reqs)], pa.string()),
        "domain": pa.array([r.domain for r in reqs], pa.string()),
    }
    for c in S.sparse_columns(config):
        cols[c] = pa.array([_sparse_id(r.entities[c] if c in r.entities else r.features.get(c)) for r in reqs], pa.int64())
    for c in S.dense_columns(config):
        vals = [r.features.get(c) for r in reqs]
        cols[c] = pa.array([0.0 if v is None else float(v) for v in vals], pa.float64())
        cols[S.present_column(c)] = pa.array([0 if v is None else 1 for v in vals], pa.int8())
    for c in S.aggregate_columns(config):
        cols[c] = pa.array(aggregates[c] if c in aggregates else np.zeros(n), pa.float64())
    return pa.table(cols)
