"""Pass-through columns (a source's `passthrough`: row ids, request ids) joined onto scores, so
every predictions file can be joined back to the user's own rows."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds

from lattice.config import PlatformConfig
from lattice.data import schema as S


def attach(config: PlatformConfig, table: Path, scores: pd.DataFrame) -> pd.DataFrame:
    """`scores` (keyed by example_id) with the table's split and pass-through columns beside it."""
    cols = ["split"] + S.passthrough_columns(config)
    data = ds.dataset(str(table), format="parquet", partitioning="hive")
    have = [c for c in cols if c in data.schema.names and c not in scores.columns]
    if not have or scores.empty:
        return scores
    keys = pd.Index(scores["example_id"].astype(str).unique())
    side = data.to_table(columns=["example_id", *have], filter=ds.field("example_id").isin(keys.tolist())).to_pandas()
    merged = scores.merge(side.drop_duplicates("example_id"), on="example_id", how="left")
    return merged[list(scores.columns) + have]  # the scores' own layout first, the joined columns after
