"""Single-process (pandas) consolidation of a config's raw sources into the example table.

The Spark pipeline in `pipelines/` is the production path; this one exists for three reasons:
unit tests of the models that should not start Spark, the pandas baseline of the pipeline
benchmark, and a readable reference of the contract in `lattice.data.schema`. It does no row
validation: rows it cannot parse raise, where the Spark pipeline quarantines them.
"""

from __future__ import annotations

import glob
import hashlib
import re
from pathlib import Path

import numpy as np
import pandas as pd

from lattice.config import PlatformConfig
from lattice.config.schema import Source
from lattice.config.timing import attribution_window, known_at_objectives
from lattice.data import schema as S
from lattice.data.split import hash_split
from lattice.paths import Paths


DATE_TOKEN = re.compile(r"\{date(?::[^{}]+)?\}")


def _read(source: Source, path: Path) -> pd.DataFrame:
    if source.format in ("csv", "tsv"):
        return pd.read_csv(
            path, sep="," if source.format == "csv" else "\t", dtype=str, keep_default_na=False,
            header=0 if source.header else None, names=None if source.header else source.schema_columns,
        )
    if source.format == "parquet":
        return pd.read_parquet(path)
    # convert_dates=False: pandas would turn columns named like "timestamp_*" into dates on its own
    return pd.read_json(path, lines=True, dtype=False, convert_dates=False)


def _times(source: Source, df: pd.DataFrame) -> pd.Series:
    et = source.event_time
    if et.format == "constant":
        return pd.Series(pd.Timestamp(et.value, tz="UTC"), index=df.index)
    col = df[et.column]
    if et.format in ("unix_seconds", "unix_millis"):
        # missing times (a label time on a row without the event) stay NaT; they are left out of
        # the conversion, where pandas' int64 path can overflow on a NaN and raise
        num = pd.to_numeric(col)
        out = pd.Series(pd.NaT, index=df.index, dtype="datetime64[ns, UTC]")
        ok = num.notna()
        out[ok] = pd.to_datetime(num[ok], unit="s" if et.format == "unix_seconds" else "ms", utc=True)
        return out
    if et.format == "iso":
        return pd.to_datetime(col, utc=True)
    fmt = _STRPTIME.get(et.format)
    if fmt is None:
        raise NotImplementedError(f"time pattern {et.format!r} needs Spark; use the Spark pipeline")
    return pd.to_datetime(col, format=fmt, utc=True)


_STRPTIME = {"yyMMddHH": "%y%m%d%H", "yyyyMMddHH": "%Y%m%d%H", "yyyy-MM-dd": "%Y-%m-%d", "yyyy-MM-dd HH:mm:ss": "%Y-%m-%d %H:%M:%S"}


def _domain(source: Source, df: pd.DataFrame) -> pd.Series:
    if isinstance(source.domain, str):
        return pd.Series(source.domain, index=df.index)
    if source.domain.expr is not None:
        raise NotImplementedError("domain expressions need Spark SQL; use the Spark pipeline")
    mapped = df[source.domain.column].astype(str).map(source.domain.map)
    return mapped.fillna(source.domain.default) if source.domain.default else mapped


def _label(source: Source, objective: str, df: pd.DataFrame) -> pd.Series:
    spec = source.labels[objective]
    if spec.expr is not None:
        raise NotImplementedError("label expressions need Spark SQL; use the Spark pipeline")
    return pd.to_numeric(df[spec.column]).astype(np.int8)


def _example_ids(source: Source, df: pd.DataFrame) -> pd.Series:
    """The twin of `pipelines.ingest.example_id_sql` + `occurrence_id_sql`: a declared key
    hashed, else the raw row hashed with each further identical copy given an id of its own."""
    cells = df[source.key] if source.key else df
    prefix = f"{source.name}\x1fkey" if source.key else source.name
    rows = cells.astype(str).agg("\x1f".join, axis=1)
    ids = rows.map(lambda r: hashlib.sha1(f"{prefix}\x1f{r}".encode()).hexdigest()[:20])
    if source.key:
        return ids
    n = ids.groupby(ids).cumcount() + 1
    return pd.Series([i if k == 1 else hashlib.sha1(f"{i}#{k}".encode()).hexdigest()[:20] for i, k in zip(ids, n)], index=df.index)


def _splits(config: PlatformConfig, source: Source, out: pd.DataFrame, raw: pd.DataFrame) -> pd.Series:
    sp = config.training.split
    if sp.kind == "hash":
        return pd.Series(hash_split(config, out["example_id"]), index=out.index)
    if sp.kind == "source":
        return pd.Series(source.split, index=out.index)
    if sp.kind == "time":
        ts = out["event_timestamp"].dt.tz_convert(None)
        return pd.Series(np.where(ts >= sp.test_start, "test", np.where(ts >= sp.validation_start, "validation", "train")), index=out.index)
    lookup = {v: name for name, vals in sp.values.items() for v in vals}
    mapped = raw[sp.column].astype(str).str.strip().map(lookup)
    if mapped.isna().any():
        raise ValueError(f"source {source.name!r}: split column {sp.column!r} holds values outside training.split.values")
    return mapped


def consolidate_source(config: PlatformConfig, source: Source, raw: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame(index=raw.index)
    out["example_id"] = _example_ids(source, raw)
    ts = _times(source, raw)
    out["event_timestamp"] = ts
    out["date"] = ts.dt.strftime("%Y-%m-%d")
    out["domain"] = _domain(source, raw)
    out["split"] = _splits(config, source, out, raw)
    for c in S.passthrough_columns(config):
        out[c] = raw[c].astype(str) if c in source.passthrough else None
    if source.expressions:
        raise NotImplementedError("column expressions need Spark SQL; use the Spark pipeline")
    canonical = {canon: raw_name for raw_name, canon in source.columns.items()}
    for col in S.sparse_columns(config):
        if col in canonical:
            out[col] = raw[canonical[col]].astype(str).map(S.stable_id).astype("Int64")
        else:
            out[col] = pd.array([pd.NA] * len(raw), dtype="Int64")
    for col in S.dense_columns(config):
        present = col in canonical
        out[col] = pd.to_numeric(raw[canonical[col]]).astype(float) if present else 0.0
        out[S.present_column(col)] = np.int8(1 if present else 0)
    for obj in config.objective_names:
        carried = obj in source.labels
        out[S.label_column(obj)] = _label(source, obj, raw) if carried else np.int8(0)
        out[S.mask_column(obj)] = np.int8(1 if carried else 0)
        truth = source.truth.get(obj)
        out[S.truth_column(obj)] = pd.to_numeric(raw[truth]).astype(float) if truth else np.nan
    event_naive = ts.dt.tz_convert(None)
    for obj in known_at_objectives(config):
        spec = source.labels.get(obj)
        known = pd.Series(pd.NaT, index=raw.index, dtype="datetime64[ns, UTC]")
        if spec is not None and spec.known_at:
            positive = out[S.label_column(obj)] == 1
            text = raw[spec.known_at]
            given = text.mask(text.astype(str).str.strip().isin(["", "nan", "None"])).where(positive)
            known = _times(source, raw.assign(**{source.event_time.column: given})).where(positive)
            bad = positive & (known.isna() | (known < ts))
            if bad.any():
                raise ValueError(f"source {source.name!r}: {int(bad.sum())} positive(s) of {obj!r} without a {spec.known_at} "
                                 "or with one before their impression; the Spark pipeline quarantines them")
            window = attribution_window(config, obj)
            late = positive & (known.dt.tz_convert(None) > event_naive + window)
            out.loc[late, S.label_column(obj)] = 0  # logged after its attribution window: not this objective's positive
            known = known.where(~late)
        out[S.known_column(obj)] = known
    # a domain that does not carry an objective is masked even if a source logs a value
    for obj in config.objectives:
        off = ~out["domain"].isin(obj.domains)
        out.loc[off, S.label_column(obj.name)] = 0
        out.loc[off, S.mask_column(obj.name)] = 0
    return out[S.consolidated_columns(config)]


def _files(source: Source, pattern: str) -> list[str]:
    """A glob's files; a folder gives its files of the source's format, at any depth (date= folders)."""
    exts = (".json", ".jsonl") if source.format == "jsonl" else (f".{source.format}",)
    out: set[str] = set()
    for p in map(Path, glob.glob(pattern)):
        if p.is_dir():
            out |= {str(f) for f in p.rglob("*") if f.is_file() and f.name.endswith(exts) and not f.name.startswith(("_", "."))}
        elif p.is_file():
            out.add(str(p))
    return sorted(out)


def consolidate(config: PlatformConfig, paths: Paths) -> pd.DataFrame:
    """All sources -> one frame ordered by event time (ties by example_id)."""
    frames = []
    for source in config.sources:
        # a date-partitioned path ({date} token) is read whole here: every day's files
        files = _files(source, DATE_TOKEN.sub("*", str(paths.source_path(source.path))))
        if not files:
            raise FileNotFoundError(f"source {source.name!r}: no file matches {paths.source_path(source.path)}")
        for f in files:
            frames.append(consolidate_source(config, source, _read(source, Path(f))))
    df = pd.concat(frames, ignore_index=True)
    return df.sort_values(["event_timestamp", "example_id"], kind="stable").reset_index(drop=True)


def write_parquet(df: pd.DataFrame, out: Path) -> Path:
    """Write with microsecond timestamps (Spark rejects pandas' default nanoseconds)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(out, index=False, coerce_timestamps="us", allow_truncated_timestamps=True)
    return out
