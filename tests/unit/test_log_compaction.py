"""The prediction log's Arrow parts compacted into parquet by the monitor
(`lattice.monitoring.compact`): every row read exactly once before, during and after a
compaction, a crash between its rename and its deletes included."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from lattice.config import load_config
from lattice.monitoring.compact import COMPACTED_FROM, compact, count_rows, log_dataset
from lattice.monitoring.records import LogSchema, record_batch, write_partitioned

ROOT = Path(__file__).resolve().parents[2]
HOUR_A = pd.Timestamp("2026-01-05T13:10Z").timestamp()
HOUR_B = pd.Timestamp("2026-01-05T14:20Z").timestamp()


@pytest.fixture(scope="module")
def config():
    return load_config(ROOT / "configs" / "demo.yaml")


def _table(config, prefix: str, n: int, when: float, features: bool = True):
    schema = LogSchema(config, features=features)
    ids = (np.arange(n, dtype=np.int64), np.ones(n, bool))
    return record_batch(
        schema, request_id=[f"{prefix}{i}" for i in range(n)], logged_at=when, origin="serve", domain=["feed"] * n,
        model_version=2, entities={"user_id": ids, "ad_id": ids}, passthrough={},
        probabilities={"click": np.linspace(0.1, 0.9, n), "conversion": np.full(n, 0.01)}, unknown=[[]] * n,
        store_error=False, sparse={}, dense={"price": np.arange(n, dtype=np.float64)})


def _rows(root: Path) -> pd.DataFrame:
    return log_dataset(root).to_table().to_pandas().sort_values("request_id").reset_index(drop=True)


def test_compaction_rewrites_the_arrow_parts_as_parquet_and_every_row_reads_the_same(config, tmp_path):
    for k in range(3):
        write_partitioned(_table(config, f"a{k}-", 50, HOUR_A), tmp_path, fmt="arrow")
    write_partitioned(_table(config, "b-", 20, HOUR_B), tmp_path, fmt="arrow")
    write_partitioned(_table(config, "batch-", 10, HOUR_A), tmp_path)  # `lattice predict`: parquet already
    before = _rows(tmp_path)
    assert len(before) == 180 and before["request_id"].is_unique

    assert compact(tmp_path) == {"folders": 2, "parts": 4, "rows": 170}
    assert not list(tmp_path.rglob("*.arrow"))
    assert sorted(p.parent.name for p in tmp_path.rglob("compact-*.parquet")) == ["hour=2026-01-05T13", "hour=2026-01-05T14"]
    after = _rows(tmp_path)
    pd.testing.assert_frame_equal(after, before)
    assert compact(tmp_path) == {"folders": 0, "parts": 0, "rows": 0}  # nothing left: a no-op
    (packed,) = tmp_path.glob("hour=2026-01-05T13/compact-*.parquet")
    assert pq.ParquetFile(packed).metadata.row_group(0).column(0).compression in {"LZ4", "LZ4_RAW"}


def test_a_crash_between_the_rename_and_the_deletes_reads_no_row_twice(config, tmp_path):
    for k in range(2):
        write_partitioned(_table(config, f"a{k}-", 30, HOUR_A), tmp_path, fmt="arrow")
    saved = tmp_path.parent / f"{tmp_path.name}-parts"
    shutil.copytree(tmp_path, saved)
    compact(tmp_path)
    for part in saved.rglob("*.arrow"):  # the parts back, as if the run died before deleting them
        shutil.copy(part, tmp_path / part.relative_to(saved))
    assert len(list(tmp_path.rglob("*.arrow"))) == 2
    assert count_rows(tmp_path) == 60
    # a part written meanwhile is no compacted file's: it is read, and compacted next time
    write_partitioned(_table(config, "late-", 5, HOUR_A), tmp_path, fmt="arrow")
    assert count_rows(tmp_path) == 65
    assert compact(tmp_path) == {"folders": 1, "parts": 1, "rows": 5}  # the leftovers deleted, not compacted again
    assert not list(tmp_path.rglob("*.arrow")) and count_rows(tmp_path) == 65
    assert len(list(tmp_path.rglob("compact-*.parquet"))) == 2


def test_parts_of_different_columns_compact_apart_and_read_together(config, tmp_path):
    write_partitioned(_table(config, "f-", 4, HOUR_A), tmp_path, fmt="arrow")
    write_partitioned(_table(config, "n-", 3, HOUR_A, features=False), tmp_path, fmt="arrow")  # features off meanwhile
    assert compact(tmp_path) == {"folders": 1, "parts": 2, "rows": 7}
    files = list(tmp_path.rglob("compact-*.parquet"))
    assert len(files) == 2
    held = sorted(len(pq.read_schema(f).metadata[COMPACTED_FROM]) > 2 for f in files)
    assert held == [True, True]
    t = _rows(tmp_path)
    assert len(t) == 7 and t.set_index("request_id")["f.price"].isna().to_dict() == {
        **{f"f-{i}": False for i in range(4)}, **{f"n-{i}": True for i in range(3)}}


def test_an_empty_or_missing_log_reads_as_nothing(tmp_path):
    assert log_dataset(tmp_path / "none") is None and count_rows(tmp_path / "none") == 0
    (tmp_path / "hour=2026-01-05T13").mkdir()
    (tmp_path / "hour=2026-01-05T13" / ".part-1.arrow.tmp").write_bytes(b"half a part")  # a write in progress
    assert log_dataset(tmp_path) is None and compact(tmp_path)["parts"] == 0


def test_a_reader_whose_parts_are_compacted_away_meanwhile_lists_again(config, tmp_path, monkeypatch):
    from lattice.monitoring import join

    log = tmp_path / "prediction_log"
    write_partitioned(_table(config, "a-", 8, HOUR_A), log, fmt="arrow")
    listed = join.log_dataset(log)  # listed before another monitor's compaction deletes the part
    compact(log)
    calls = []

    def stale_then_fresh(root):
        calls.append(root)
        return listed if len(calls) == 1 else log_dataset(root)

    monkeypatch.setattr(join, "log_dataset", stale_then_fresh)
    got = join.read_log(tmp_path)
    assert len(calls) == 2 and sorted(got["request_id"]) == sorted(f"a-{i}" for i in range(8))
