"""A small local example table for tests, benchmarks and first runs without Spark: the pandas
reference consolidation (`local_consolidate`) written in the same layout as the Spark pipeline's
consolidated output (`date=/domain=/part-*.parquet`)."""

from __future__ import annotations

import glob
from pathlib import Path

import pandas as pd

from lattice.config import PlatformConfig
from lattice.config.schema import Source
from lattice.data import local_consolidate as LC
from lattice.paths import Paths


def _read(source: Source, path: Path) -> pd.DataFrame:
    if source.format == "jsonl":
        # pandas would parse columns named like 'timestamp_*' as dates on its own; keep raw values
        return pd.read_json(path, lines=True, dtype=False, convert_dates=False)
    return LC._read(source, path)


def consolidate_local(config: PlatformConfig, paths: Paths) -> pd.DataFrame:
    frames = []
    for source in config.sources:
        files = sorted(glob.glob(str(paths.source_path(source.path))))
        if not files:
            raise FileNotFoundError(f"source {source.name!r}: no file matches {paths.source_path(source.path)}")
        frames += [LC.consolidate_source(config, source, _read(source, Path(f))) for f in files]
    df = pd.concat(frames, ignore_index=True)
    return df.sort_values(["event_timestamp", "example_id"], kind="stable").reset_index(drop=True)


def write_local_table(config: PlatformConfig, paths: Paths, out: Path | None = None, row_group_size: int = 50_000) -> Path:
    """Consolidate the config's raw sources with pandas and write them partitioned by date and domain."""
    out = out or paths.consolidated
    df = consolidate_local(config, paths)
    for (date, domain), g in df.groupby(["date", "domain"], sort=True):
        f = out / f"date={date}" / f"domain={domain}" / "part-00000.parquet"
        f.parent.mkdir(parents=True, exist_ok=True)
        g.drop(columns=["date", "domain"]).to_parquet(f, index=False, coerce_timestamps="us", allow_truncated_timestamps=True,
                                                       row_group_size=row_group_size)
    return out
