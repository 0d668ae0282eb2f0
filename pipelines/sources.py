"""Refuse sources that cannot be read as configured: no file matches, a required column is
missing, files disagree on their columns, or the source lost a column since the last run; and
choose a run window's files. Every error names the source, the path and the fix. Listing a
source's files and reading their columns is `lattice.data.source_files` (re-exported here)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from dataclasses import dataclass, field

from lattice.config.schema import Source
from lattice.data.source_files import (  # noqa: F401 (re-exported: the pipelines' callers keep one import)
    DATE_TOKEN,
    SourceError,
    expand_braces,
    file_columns,
    matching_files,
    required_columns,
    source_files,
)
from lattice.paths import Paths

# a hive-style `date=yyyy-MM-dd` folder anywhere in a file's path
_HIVE_DATE = re.compile(r"(?:^|/)date=(\d{4}-\d{2}-\d{2})(?=/)")


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


@dataclass
class FileSelection:
    """The files a run reads from one source. `by_day` (date-partitioned sources only): files per
    day of the run's window, so a day without files is visible as an empty day."""

    files: list[str]
    partitioned: bool
    by_day: dict[str, int] = field(default_factory=dict)
    empty_files: list[str] = field(default_factory=list)
    """0-byte files (a writer's empty part file): 0 rows, not a failure; never handed to Spark,
    which cannot read a 0-byte parquet file and finds no header in a 0-byte csv."""

    @property
    def empty_days(self) -> list[str]:
        return [d for d, n in self.by_day.items() if n == 0]


def _without_empty(selection: FileSelection) -> FileSelection:
    empty = [f for f in selection.files if os.path.getsize(f) == 0]
    if not empty:
        return selection
    gone = set(empty)
    return FileSelection([f for f in selection.files if f not in gone], selection.partitioned, selection.by_day, empty)


def days_in(start: dt.date, end: dt.date) -> list[dt.date]:
    """Every day of [start, end)."""
    return [start + dt.timedelta(days=i) for i in range((end - start).days)]


def date_pattern(pattern: str, day: dt.date) -> str:
    """Fill a path's `{date}` / `{date:FORMAT}` tokens with one day."""
    return DATE_TOKEN.sub(lambda m: day.strftime(m.group(1) or "%Y-%m-%d"), pattern)


def hive_date(path: str) -> dt.date | None:
    """The day of a file under a `date=yyyy-MM-dd/` folder (the innermost one), else None."""
    found = _HIVE_DATE.findall(path.replace("\\", "/"))
    return dt.date.fromisoformat(found[-1]) if found else None


def select_files(paths: Paths, source: Source, start: dt.date, end: dt.date) -> FileSelection:
    """The files of `source` that can hold events of [start, end).

    A path with a `{date}` token is listed day by day; files under hive `date=` folders are kept
    when their day is in the window (files outside any such folder are always kept: they may hold
    any day). Either way a day with no file is recorded, not an error, as long as the source has
    files on some day (otherwise the path is wrong and the run stops, as for any other source).
    Any other source is read whole and filtered by event time downstream. A 0-byte file counts
    0 rows (`empty_files`), never a failure."""
    return _without_empty(_select_files(paths, source, start, end))


def _select_files(paths: Paths, source: Source, start: dt.date, end: dt.date) -> FileSelection:
    full = str(paths.source_path(source.path))
    if DATE_TOKEN.search(full):
        by_day, files = {}, []
        for day in days_in(start, end):
            found = matching_files(date_pattern(full, day), source.format)
            by_day[str(day)] = sum(1 for f in found if os.path.getsize(f) > 0)  # an empty file: no rows that day
            files += found
        if not files and not matching_files(DATE_TOKEN.sub("*", full), source.format):
            raise SourceError(f"source {source.name!r}: no file matches {full} on any day (check 'path' and data_root, "
                              f"or set LATTICE_SHARED_DATA / LATTICE_DEMO_DATA)")
        return FileSelection(sorted(set(files)), True, by_day)
    every = source_files(paths, source)
    dated = {f: hive_date(f) for f in every}
    if not any(d is not None for d in dated.values()):
        return FileSelection(every, False)
    by_day = {str(day): 0 for day in days_in(start, end)}
    files = []
    for f, d in dated.items():
        if d is None:
            files.append(f)
        elif start <= d < end:
            files.append(f)
            by_day[str(d)] += os.path.getsize(f) > 0
    return FileSelection(files, True, by_day)
