"""Turn example-table rows into /predict requests (the demo's serving check, tests, benchmarks)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from lattice.config import PlatformConfig
from lattice.data import schema as S


def requests_from_rows(config: PlatformConfig, rows: pd.DataFrame) -> list[dict[str, Any]]:
    """Entity keys plus the request-time features each row logged (absent features left out)."""
    entity = {f.column for f in config.entity_features}
    out = []
    for r in rows.to_dict("records"):
        feats: dict[str, Any] = {}
        for c in S.sparse_columns(config):
            if c not in entity and not pd.isna(r[c]):
                feats[c] = int(r[c])
        for c in S.dense_columns(config):
            if r[S.present_column(c)] == 1:
                feats[c] = float(r[c])
        out.append({"request_id": str(r["example_id"]), "domain": r["domain"],
                    "entities": {k: int(r[k]) for k in sorted(entity)}, "features": feats})
    return out
