"""A small local example table for tests, benchmarks and first runs without Spark: the pandas
reference consolidation (`local_consolidate`) written in the same layout as the Spark pipeline's
consolidated output (`date=/domain=/part-*.parquet`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lattice.config import PlatformConfig
from lattice.data.local_consolidate import consolidate
from lattice.paths import Paths


def write_local_table(config: PlatformConfig, paths: Paths, out: Path | None = None, row_group_size: int = 50_000,
                      df: pd.DataFrame | None = None) -> Path:
    """Consolidate the config's raw sources with pandas (or take `df`, their consolidated rows) and
    write them partitioned by date and domain."""
    out = out or paths.consolidated
    df = consolidate(config, paths) if df is None else df
    for (date, domain), g in df.groupby(["date", "domain"], sort=True):
        f = out / f"date={date}" / f"domain={domain}" / "part-00000.parquet"
        f.parent.mkdir(parents=True, exist_ok=True)
        g.drop(columns=["date", "domain"]).to_parquet(f, index=False, coerce_timestamps="us", allow_truncated_timestamps=True,
                                                       row_group_size=row_group_size)
    return out
