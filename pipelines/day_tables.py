"""Derived tables kept by day: the aggregates and the training set live in `date=YYYY-MM-DD`
folders, so a run over a data interval replaces exactly its days and keeps every other one.

A daily run used to rewrite each of them whole: the training set then held only the run's own day
(a windowed teacher after it saw one day of its window), and the aggregates re-read all history.
`write_days` is the one way these tables are written:

* a run with a window (`lattice features --start/--end`, a scheduled or backfilled DAG run)
  replaces the window's day folders (Spark's dynamic partition overwrite), and removes a day
  folder of the window the run produced no rows for (its rows are gone upstream);
* a run without one, or a table still in the flat layout of older versions, is rewritten whole
  (a static overwrite: days that are no longer produced disappear).
"""

from __future__ import annotations

import datetime as dt
import logging
import shutil
from pathlib import Path

log = logging.getLogger(__name__)
DAY = "date"  # the partition column: the UTC day a row belongs to


def day_layout(root: Path) -> bool:
    """True when `root` holds a table kept by day (only `date=` folders and Spark's markers)."""
    if not root.is_dir():
        return False
    entries = [p for p in root.iterdir() if not p.name.startswith((".", "_"))]
    return bool(entries) and all(p.is_dir() and p.name.startswith(f"{DAY}=") for p in entries)


def window_days(window: tuple[dt.datetime, dt.datetime]) -> list[str]:
    lo, hi = window[0].date(), window[1].date()
    return [str(lo + dt.timedelta(days=i)) for i in range((hi - lo).days)]


def written_days(root: Path) -> list[str]:
    return sorted(p.name.split("=", 1)[1] for p in root.glob(f"{DAY}=*") if p.is_dir()) if root.is_dir() else []


def _files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


def reach_forward(root: Path, window: tuple[dt.datetime, dt.datetime] | None,
                  reach: dt.timedelta) -> tuple[tuple[dt.datetime, dt.datetime] | None, list[str]]:
    """A run over days that come before days `root` already holds (a backfill out of order, a late
    file re-run): the later days whose trailing windows (at most `reach` long) read the run's days
    are recomputed with them, so no kept day is left computed from the old events. Returns the
    window extended to cover them, and those days."""
    if window is None or not day_layout(root) or reach <= dt.timedelta(0):
        return window, []
    hi = window[1]
    # a day d reads events back to d - reach: it reads the run's days when d < hi + reach
    later = [d for d in written_days(root)
             if hi.date() <= dt.date.fromisoformat(d) and dt.datetime.combine(dt.date.fromisoformat(d), dt.time(),
                                                                               hi.tzinfo) < hi + reach]
    if not later:
        return window, []
    end = dt.datetime.combine(dt.date.fromisoformat(later[-1]) + dt.timedelta(days=1), dt.time(), hi.tzinfo)
    log.info("%s: the run's days [%s, %s) precede kept days %s..%s whose trailing windows read them; "
             "those are recomputed too", root.name, window[0].date(), hi.date(), later[0], later[-1])
    return (window[0], end), later


def write_days(frame, root: Path, window: tuple[dt.datetime, dt.datetime] | None) -> dict:
    """Write `frame` (a Spark DataFrame with a `date` column) under `root` by day; see the module
    docstring for what is replaced. Returns the mode used and the days written and removed."""
    incremental = window is not None and day_layout(root)
    if window is not None and not incremental and root.exists():
        log.info("%s is not kept by day yet (a first run, or the flat layout of an older version): rewritten whole", root)
    # the window's day folders before the write, by their files: Spark names every file it writes
    # after its job, so a day the write replaced holds none of its old files afterwards
    before = {d: _files(root / f"{DAY}={d}") for d in window_days(window)} if incremental else {}
    writer = frame.write.mode("overwrite").partitionBy(DAY)
    # the session's dynamic mode replaces only the days present; a whole rewrite must drop the rest
    writer.option("partitionOverwriteMode", "dynamic" if incremental else "static").parquet(str(root))
    removed: list[str] = []
    for day, files in before.items():
        if files and files <= _files(root / f"{DAY}={day}"):  # not rewritten: no rows for it any more
            shutil.rmtree(root / f"{DAY}={day}")
            removed.append(day)
    return {"mode": "days" if incremental else "whole", "days": window_days(window) if incremental else written_days(root),
            "removed_days": removed}
