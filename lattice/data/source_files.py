"""The files of a configured source and their raw column names, read without Spark.

Shared by the pipelines (ingest, validation, scoring input) and by `lattice config check`'s
data check, so both list a source's files and name its columns by one rule; neither imports
the other. Every error names the source, the path and the fix."""

from __future__ import annotations

import csv
import glob
import json
import re
from pathlib import Path

from lattice.config.schema import Source
from lattice.paths import Paths

_BRACE = re.compile(r"\{([^{}]*)\}")
# `{date}` (yyyy-MM-dd) or `{date:%Y%m%d}` (any strftime format) in a source's path: one folder or
# file name per day, so a run over [start, end) lists only those days' files
DATE_TOKEN = re.compile(r"\{date(?::([^{}]+))?\}")


class SourceError(ValueError):
    """A source cannot be ingested as configured (the run stops before reading any row)."""


def expand_braces(pattern: str) -> list[str]:
    """`{dev,test}.csv` -> [`dev.csv`, `test.csv`] (Python's glob has no brace sets; Spark's does).
    A `{date}` token is not a brace set: `date_pattern` fills it in first."""
    if DATE_TOKEN.search(pattern):
        raise SourceError(f"path {pattern!r} still holds a {{date}} token here; its files are chosen per day "
                          "(pipelines.sources.select_files)")
    m = _BRACE.search(pattern)
    if not m:
        return [pattern]
    out = []
    for alt in m.group(1).split(","):
        out += expand_braces(pattern[: m.start()] + alt + pattern[m.end():])
    return out


def matching_files(pattern: str, fmt: str) -> list[str]:
    """Files of a path, glob (with brace sets) or folder; a folder gives every file of format
    `fmt` in it (Spark's part files too), skipping hidden and `_`-prefixed ones."""
    exts = (".json", ".jsonl") if fmt == "jsonl" else (f".{fmt}",)
    files: set[str] = set()
    for p in (f for pat in expand_braces(pattern) for f in glob.glob(pat)):
        if Path(p).is_dir():
            files |= {str(f) for f in Path(p).rglob("*") if f.is_file() and f.name.endswith(exts) and not f.name.startswith(("_", "."))}
        elif Path(p).is_file():
            files.add(p)
    return sorted(files)


def source_files(paths: Paths, source: Source) -> list[str]:
    """Every file of a source (all days of a `{date}` path: `select_files` picks a window's)."""
    full = DATE_TOKEN.sub("*", str(paths.source_path(source.path)))
    files = matching_files(full, source.format)
    if not files:
        raise SourceError(f"source {source.name!r}: no file matches {full} (check 'path' and data_root, "
                          f"or set LATTICE_SHARED_DATA / LATTICE_DEMO_DATA)")
    return files


def required_columns(source: Source, split_column: str | None = None) -> list[str]:
    """Raw columns the config reads by name (expressions may read more; Spark names those)."""
    cols = list(source.columns) + list(source.key) + list(source.passthrough) + ([split_column] if split_column else [])
    if source.event_time.column:
        cols.append(source.event_time.column)
    cols += [spec.column for spec in source.labels.values() if spec.column]
    cols += [spec.known_at for spec in source.labels.values() if spec.known_at]
    cols += list(source.truth.values())
    if not isinstance(source.domain, str) and source.domain.column:
        cols.append(source.domain.column)
    return list(dict.fromkeys(cols))


def _first_line(path: str) -> str:
    with open(path, newline="", encoding="utf-8", errors="replace") as fh:
        return fh.readline()


def file_columns(source: Source, path: str) -> list[str]:
    """Column names of one raw file, read from its header / footer / first records only."""
    if source.format in ("csv", "tsv"):
        if not source.header:
            return list(source.schema_columns or [])
        line = _first_line(path)
        return next(csv.reader([line], delimiter="," if source.format == "csv" else "\t"), [])
    if source.format == "parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    keys: dict[str, None] = {}
    with open(path, encoding="utf-8", errors="replace") as fh:
        for i, line in enumerate(fh):
            if i >= 200:
                break
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # malformed lines are quarantined later, row by row
            if isinstance(rec, dict):
                keys.update(dict.fromkeys(rec))
    return list(keys)
