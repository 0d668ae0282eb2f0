"""Date-partitioned sources: a run over [start, end) lists only those days' files; a day without
files is recorded as empty, not an error; a wrong path still stops the run."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from lattice.config.schema import Source
from lattice.paths import Paths
from pipelines.sources import SourceError, date_pattern, hive_date, select_files

D = dt.date


def _source(path: str, fmt: str = "csv") -> Source:
    return Source(name="s", path=path, format=fmt, domain="feed", event_time={"column": "ts", "format": "unix_seconds"})


def _touch(root: Path, *names: str) -> None:
    for n in names:
        p = root / n
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("ts\n1\n")


def test_date_token_lists_only_the_window_days(tmp_path: Path) -> None:
    _touch(tmp_path, "feed/2026-01-01/a.csv", "feed/2026-01-02/a.csv", "feed/2026-01-02/b.csv", "feed/2026-01-04/a.csv")
    paths = Paths(tmp_path / "wd", tmp_path)
    sel = select_files(paths, _source("feed/{date}/*.csv"), D(2026, 1, 2), D(2026, 1, 4))
    assert [Path(f).relative_to(tmp_path).as_posix() for f in sel.files] == ["feed/2026-01-02/a.csv", "feed/2026-01-02/b.csv"]
    assert sel.partitioned and sel.by_day == {"2026-01-02": 2, "2026-01-03": 0}
    assert sel.empty_days == ["2026-01-03"]


def test_date_token_with_a_format_and_an_empty_window(tmp_path: Path) -> None:
    _touch(tmp_path, "feed/day=20260101.csv", "feed/day=20260105.csv")
    paths = Paths(tmp_path / "wd", tmp_path)
    src = _source("feed/day={date:%Y%m%d}.csv")
    assert date_pattern("x/{date:%Y%m%d}/{date}", D(2026, 1, 5)) == "x/20260105/2026-01-05"
    sel = select_files(paths, src, D(2026, 1, 2), D(2026, 1, 4))
    assert sel.files == [] and sel.empty_days == ["2026-01-02", "2026-01-03"]  # empty days, not an error
    assert len(select_files(paths, src, D(2026, 1, 5), D(2026, 1, 6)).files) == 1


def test_wrong_date_path_is_an_error(tmp_path: Path) -> None:
    paths = Paths(tmp_path / "wd", tmp_path)
    with pytest.raises(SourceError, match="no file matches .* on any day"):
        select_files(paths, _source("nowhere/{date}/*.csv"), D(2026, 1, 1), D(2026, 1, 3))


def test_hive_date_folders_are_filtered_by_the_window(tmp_path: Path) -> None:
    _touch(tmp_path, "video/date=2026-01-01/part-0.jsonl", "video/date=2026-01-02/part-1.jsonl",
           "video/date=2026-01-03/part-2.jsonl", "video/extra.jsonl")
    paths = Paths(tmp_path / "wd", tmp_path)
    sel = select_files(paths, _source("video", "jsonl"), D(2026, 1, 2), D(2026, 1, 3))
    rel = [Path(f).relative_to(tmp_path).as_posix() for f in sel.files]
    # a file outside any date= folder may hold any day: it is kept (and filtered by event time)
    assert rel == ["video/date=2026-01-02/part-1.jsonl", "video/extra.jsonl"]
    assert sel.by_day == {"2026-01-02": 1}
    assert hive_date("/x/date=2026-01-03/y/date=2026-01-04/p.csv") == D(2026, 1, 4)
    assert hive_date("/x/mydate=2026-01-03/p.csv") is None


def test_undated_source_is_read_whole(tmp_path: Path) -> None:
    _touch(tmp_path, "feed/a.csv", "feed/b.csv")
    sel = select_files(Paths(tmp_path / "wd", tmp_path), _source("feed/*.csv"), D(2026, 1, 2), D(2026, 1, 3))
    assert len(sel.files) == 2 and not sel.partitioned and sel.by_day == {}
