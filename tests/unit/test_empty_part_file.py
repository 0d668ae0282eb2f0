"""Issue 37 finding 10: an empty (0-byte) part file is 0 rows, not a failure of the feature run."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from lattice.config.schema import Source
from lattice.paths import Paths
from pipelines.sources import select_files, source_columns

D = dt.date


def test_a_zero_byte_part_file_is_listed_as_empty_and_not_read(tmp_path: Path) -> None:
    for day in ("2026-01-01", "2026-01-02"):
        (tmp_path / "search" / f"date={day}").mkdir(parents=True)
    pq.write_table(pa.table({"ts": ["1"], "uid": ["7"]}), tmp_path / "search" / "date=2026-01-01" / "part-0.parquet")
    (tmp_path / "search" / "date=2026-01-01" / "part-1.parquet").write_bytes(b"")  # a writer's empty part
    (tmp_path / "search" / "date=2026-01-02" / "part-0.parquet").write_bytes(b"")
    src = Source(name="s", path="search", format="parquet", domain="search", columns={"uid": "user_id"},
                 event_time={"column": "ts", "format": "unix_seconds"})
    sel = select_files(Paths(tmp_path / "wd", tmp_path), src, D(2026, 1, 1), D(2026, 1, 3))
    assert [Path(f).name for f in sel.files] == ["part-0.parquet"] and len(sel.empty_files) == 2
    assert sel.by_day == {"2026-01-01": 1, "2026-01-02": 0} and sel.empty_days == ["2026-01-02"]
    assert source_columns(src, sel.files) == ["ts", "uid"]  # the rest of the source still reads


def test_a_zero_byte_csv_does_not_stop_the_source(tmp_path: Path) -> None:
    (tmp_path / "feed").mkdir()
    (tmp_path / "feed" / "a.csv").write_text("ts,uid\n1,7\n")
    (tmp_path / "feed" / "b.csv").write_bytes(b"")
    src = Source(name="s", path="feed/*.csv", format="csv", domain="feed", columns={"uid": "user_id"},
                 event_time={"column": "ts", "format": "unix_seconds"})
    sel = select_files(Paths(tmp_path / "wd", tmp_path), src, D(2026, 1, 1), D(2026, 1, 2))
    assert [Path(f).name for f in sel.files] == ["a.csv"] and [Path(f).name for f in sel.empty_files] == ["b.csv"]
    assert source_columns(src, sel.files) == ["ts", "uid"]
