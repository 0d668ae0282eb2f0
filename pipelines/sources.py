"""Find a source's files and its raw column names, and refuse sources that cannot be read as
configured: no file matches, a required column is missing, files disagree on their columns, or
the source lost a column since the last run. Every error names the source, the path and the fix."""

from __future__ import annotations

import csv
import glob
import json
import re
from pathlib import Path

from lattice.config.schema import Source
from lattice.paths import Paths

_BRACE = re.compile(r"\{([^{}]*)\}")


class SourceError(ValueError):
    """A source cannot be ingested as configured (the run stops before reading any row)."""


def expand_braces(pattern: str) -> list[str]:
    """`{dev,test}.csv` -> [`dev.csv`, `test.csv`] (Python's glob has no brace sets; Spark's does)."""
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
    full = str(paths.source_path(source.path))
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


def source_columns(source: Source, files: list[str], split_column: str | None = None) -> list[str]:
    """The raw column list of a source; every file must carry every required column, and csv
    files with a header must agree on the header (Spark reads csv columns by position)."""
    need = required_columns(source, split_column)
    first: list[str] | None = None
    union: dict[str, None] = {}
    for f in files:
        cols = file_columns(source, f)
        missing = [c for c in need if c not in cols]
        if missing:
            raise SourceError(f"source {source.name!r}: file {f} lacks column(s) {missing} that the config reads "
                              f"(it has {cols}); restore them in the data or change the source's mapping")
        if first is None:
            first = cols
        elif source.format in ("csv", "tsv") and cols != first:
            raise SourceError(f"source {source.name!r}: file {f} has header {cols} but {files[0]} has {first}; "
                              "csv files of one source must share one header")
        union.update(dict.fromkeys(cols))
    return list(union)


def check_schema_drift(paths: Paths, source: Source, columns: list[str], record: bool = True) -> list[str]:
    """Compare with the columns recorded by the last run; a lost column is an error (a silent
    schema change upstream), a new one is recorded. Returns the new columns."""
    store = paths.workdir / "source_schemas.json"
    known = json.loads(store.read_text()) if store.exists() else {}
    prev = known.get(source.name)
    if prev is not None:
        lost = [c for c in prev if c not in columns]
        if lost:
            raise SourceError(
                f"source {source.name!r} at {paths.source_path(source.path)}: lost column(s) {lost} since the last run "
                f"(was {prev}, now {columns}); restore them upstream, or delete {store} to accept the new schema"
            )
    added = [c for c in columns if prev is not None and c not in prev]
    if record:
        known[source.name] = columns
        store.parent.mkdir(parents=True, exist_ok=True)
        store.write_text(json.dumps(known, indent=2, sort_keys=True))
    return added
