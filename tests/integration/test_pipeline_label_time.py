"""Real Spark: a date-partitioned source reads only the run's day; a day without files is an
empty day; a label time before its impression (or missing on a positive) is quarantined with its
reason; the consolidated table keeps each positive's time for the cutoff rule."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pytest

from test_pipeline_helpers import paths_for, read_table, write_config

pytestmark = pytest.mark.slow

HEADER = "uid,aid,ts,price,clicked,converted,conv_ts"
DAY2 = 1767312000  # 2026-01-02 00:00:00 UTC
DAY3 = DAY2 + 86400


def _config(tmp, data):
    cfg = {
        "name": "timed",
        "data_root": str(data),
        "time_range": {"start": "2026-01-01", "end": "2026-01-08"},
        "domains": [{"name": "feed", "min_rows": 1}],
        "objectives": [{"name": "click", "domains": ["feed"]},
                       {"name": "conversion", "domains": ["feed"], "attribution": "3d"}],
        "sources": [{
            "name": "web_log", "path": "web/date={date}/*.csv", "format": "csv", "domain": "feed",
            "columns": {"uid": "user_id", "aid": "ad_id", "price": "price"},
            "event_time": {"column": "ts", "format": "unix_seconds"},
            "labels": {"click": {"column": "clicked"}, "conversion": {"column": "converted", "known_at": "conv_ts"}},
        }],
        "features": {"sparse": [{"name": "user_id", "column": "user_id", "entity": True},
                                {"name": "ad_id", "column": "ad_id", "entity": True}],
                     "dense": [{"name": "price", "column": "price"}]},
    }
    return write_config(tmp, cfg)


@pytest.fixture(scope="module")
def timed(spark, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("timed")
    data = tmp / "data"
    good2 = [f"{i + 1},{i % 3 + 1},{DAY2 + 600 * i},2.5,{int(i % 2 == 0)},0," for i in range(10)]
    good2[0] = f"1,1,{DAY2},2.5,1,1,{DAY2 + 2 * 86400}"        # converts 2 days later: inside the 3d window
    good2[2] = f"3,3,{DAY2 + 1200},2.5,1,1,{DAY2 + 5 * 86400}"  # 5 days later: outside it, a negative
    bad2 = {f"11,1,{DAY2 + 3600},2.5,1,1,{DAY2 + 60}": "label_before_event",
            f"12,1,{DAY2 + 3600},2.5,1,1,": "label_time_missing"}
    (data / "web" / "date=2026-01-02").mkdir(parents=True)
    (data / "web" / "date=2026-01-02" / "part-0.csv").write_text("\n".join([HEADER, *good2, *bad2]) + "\n")
    (data / "web" / "date=2026-01-03").mkdir(parents=True)
    (data / "web" / "date=2026-01-03" / "part-0.csv").write_text(
        "\n".join([HEADER, *[f"{i + 1},1,{DAY3 + 60 * i},1.0,0,0," for i in range(25)]]) + "\n")
    config = _config(tmp, data)
    return config, paths_for(config, tmp / "wd"), bad2


def test_one_day_reads_only_its_files_and_quarantines_bad_label_times(timed):
    from pipelines.consolidate import ingest_and_consolidate

    config, paths, bad = timed
    res = ingest_and_consolidate(config, paths, start="2026-01-02", end="2026-01-03")
    src = res["sources"]["web_log"]
    assert src["files"] == 1 and src["files_by_day"] == {"2026-01-02": 1}
    assert res["raw_rows_read"] == 12  # the 25 rows of 2026-01-03 were never read, not just skipped
    assert res["totals"]["skipped"] == 0
    assert res["quarantine_reasons"] == {"label_before_event": 1, "label_time_missing": 1}
    q = read_table(paths.quarantine).set_index("raw")
    for line, reason in bad.items():
        assert q.loc[line, "reason"] == reason
    df = read_table(paths.consolidated).sort_values("event_timestamp").reset_index(drop=True)
    assert len(df) == 10 and res["partitions"] == ["2026-01-02"]
    known = pd.to_datetime(df.known_conversion, utc=True)
    assert known.iloc[0] == pd.Timestamp(dt.datetime(2026, 1, 4), tz="UTC") and df.label_conversion.iloc[0] == 1
    # the conversion 5 days after its impression is outside the 3-day window: a negative, no time
    assert df.label_conversion.iloc[2] == 0 and pd.isna(df.known_conversion.iloc[2])
    assert df.label_conversion.sum() == 1 and known.notna().sum() == 1


def test_a_day_without_files_is_an_empty_day(timed):
    from pipelines.consolidate import ingest_and_consolidate

    config, paths, _ = timed
    res = ingest_and_consolidate(config, paths, start="2026-01-04", end="2026-01-05")
    assert res["status"] == "ok" and res["empty"] is True
    assert res["empty_days"] == ["2026-01-04"] and res["raw_rows_read"] == 0
    assert res["sources"]["web_log"]["files_by_day"] == {"2026-01-04": 0}
    # the earlier day's partition is untouched
    assert sorted(read_table(paths.consolidated).date.unique()) == ["2026-01-02"]
