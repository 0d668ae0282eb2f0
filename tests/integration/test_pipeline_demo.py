"""The whole feature chain on the synthetic 3-domain demo logs (three schemas, three formats),
run once through the CLI in-process, then checked: union schema, masks, reconciliation, the
point-in-time leak test, re-run idempotence, the online store and the summary."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pandas as pd
import pytest

from lattice.data import schema as S
from lattice.data.synth import generate

from test_pipeline_helpers import config_with, paths_for, read_table

pytestmark = pytest.mark.slow
ROWS = 3000


@pytest.fixture(scope="module")
def demo(spark, root, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("demo")
    raw = tmp / "raw"
    config = config_with(root, "demo", {"data_root": str(raw), "workdir": str(tmp / "wd")}, tmp)
    manifest = generate(config, ROWS, raw, progress=False)
    paths = paths_for(config, tmp / "wd")
    import subprocess
    import sys

    # its own process, as a user runs it: state other test modules leave in this process
    # (Airflow's logging and environment, an active Spark session) cannot leak into the run
    res = subprocess.run([sys.executable, "-m", "lattice.cli", "features", config.source_file, "--workdir", str(paths.workdir)],
                         cwd=root, capture_output=True, text=True, timeout=1500)
    summary_file = paths.workdir / "features_summary.json"
    assert summary_file.exists(), res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads(summary_file.read_text())
    return {"config": config, "paths": paths, "manifest": manifest, "rc": res.returncode, "stdout": res.stdout, "summary": summary}


def test_cli_reports_stages_and_reconciliation(demo):
    assert demo["rc"] == 0, demo["stdout"]
    text = demo["stdout"]
    for stage in ("consolidate", "aggregates", "feast_apply", "training_set", "materialize"):
        assert f"[{stage:<12}]" in text
    assert "rows in" in text and "balanced" in text
    s = demo["summary"]
    assert s["status"] == "ok"
    assert set(s["timings"]) >= {"consolidate", "aggregates", "feast_apply", "training_set", "materialize", "total"}
    assert s["paths"]["data_docs"] and s["paths"]["data_docs"].endswith("index.html")


def test_union_schema_types_and_masks(demo):
    config, paths = demo["config"], demo["paths"]
    df = read_table(paths.consolidated)
    assert set(df.columns) == set(S.consolidated_columns(config))
    import pyarrow.dataset as ds

    schema = ds.dataset(str(paths.consolidated), format="parquet").schema
    assert str(schema.field("event_timestamp").type) == "timestamp[us, tz=UTC]"
    assert str(schema.field("user_id").type) == "int64" and str(schema.field("label_click").type) == "int8"
    by = {d: g for d, g in df.groupby("domain")}
    assert set(by) == {"feed", "search", "video"}
    # video logs no conversion: masked, never a fake negative
    assert (by["video"]["mask_conversion"] == 0).all() and (by["video"]["label_conversion"] == 0).all()
    assert (by["feed"]["mask_conversion"] == 1).all() and (by["search"]["mask_click"] == 1).all()
    # a feature a domain lacks: null sparse, zero-filled dense with a presence flag
    assert by["feed"]["query_category"].isna().all() and by["search"]["query_category"].notna().all()
    assert (by["video"]["price"] == 0).all() and (by["video"]["price_present"] == 0).all()
    assert (by["feed"]["price_present"] == 1).all()
    assert by["video"]["truth_conversion"].isna().all() and by["feed"]["truth_click"].notna().all()
    assert df["example_id"].is_unique
    assert ((df["label_click"] <= df["mask_click"]) & (df["label_conversion"] <= df["mask_conversion"])).all()


def test_counts_reconcile(demo):
    recon = {r["domain"]: r for r in demo["summary"]["reconciliation"]}
    for domain, n in demo["manifest"]["rows_per_domain"].items():
        r = recon[domain]
        assert r["rows_in"] == n
        assert r["rows_in"] == r["rows_out"] + r["quarantined"] + r["skipped"] and r["balanced"]
    assert demo["summary"]["counts"]["training_set"] == sum(r["rows_out"] for r in recon.values())


def test_spark_ids_agree_with_pandas_reference(demo):
    """stable_id and example_id: Spark and lattice.data.local_consolidate agree (csv source)."""
    import glob

    from lattice.data.local_consolidate import _read, consolidate_source

    config, paths = demo["config"], demo["paths"]
    feed = next(s for s in config.sources if s.name == "feed_log")
    files = sorted(glob.glob(str(paths.source_path(feed.path))))
    ref = pd.concat([consolidate_source(config, feed, _read(feed, f)) for f in files])
    ref = ref.set_index("example_id")
    got = read_table(paths.consolidated)
    got = got[got.domain == "feed"].set_index("example_id")
    assert set(ref.index) == set(got.index)
    for col in ("user_id", "ad_id", "position", "label_click", "label_conversion"):
        assert (ref.loc[got.index, col].astype("int64").values == got[col].astype("int64").values).all(), col
    assert np.allclose(ref.loc[got.index, "price"].values, got["price"].values)


def _brute_force(examples: pd.DataFrame, key: str, objective: str, hours: int, at: pd.Series, ids: pd.Series):
    """count/positives of labeled events of the same entity in [t - window, t), by brute force."""
    ev = examples[[key, "event_timestamp", S.label_column(objective), S.mask_column(objective)]]
    rows = pd.DataFrame({key: ids.reset_index(drop=True), "t": at.reset_index(drop=True)})
    m = rows.reset_index().merge(ev, on=key)
    w = pd.Timedelta(hours=hours)
    inside = (m.event_timestamp < m.t) & (m.event_timestamp >= m.t - w)
    m = m[inside]
    n = m.groupby("index")[S.mask_column(objective)].sum()
    p = (m[S.label_column(objective)] * m[S.mask_column(objective)]).groupby(m["index"]).sum()
    return n.reindex(rows.index, fill_value=0).values, p.reindex(rows.index, fill_value=0).values


def test_training_set_is_point_in_time_correct_no_leak(demo):
    """Leak test: every aggregate equals a brute-force count over events STRICTLY before the
    example's time; an event at the same instant or later never counts."""
    config, paths = demo["config"], demo["paths"]
    ts = read_table(paths.training_set)
    examples = read_table(paths.consolidated)
    assert len(ts) == len(examples) and ts["example_id"].is_unique
    assert set(S.aggregate_columns(config)) <= set(ts.columns)
    for agg in config.features.aggregates:
        key = next(f.column for f in config.features.sparse if f.name == agg.entity)
        for w, hours in zip(agg.windows, agg.window_hours()):
            n, p = _brute_force(examples, key, agg.objective, hours, ts["event_timestamp"], ts[key])
            assert (ts[f"{agg.name}_count_{w}"].values == n).all(), (agg.name, w)
            assert (ts[f"{agg.name}_positives_{w}"].values == p).all(), (agg.name, w)
            rate = np.where(n > 0, p / np.maximum(n, 1), 0.0)
            assert np.allclose(ts[f"{agg.name}_rate_{w}"].values, rate)
    # the first appearance of every user has seen nothing, even its own label
    first = ts.sort_values("event_timestamp").groupby("user_id").head(1)
    same_instant = ts.groupby(["user_id", "event_timestamp"]).example_id.transform("count") > 1
    assert (first.loc[~same_instant.loc[first.index], "user_click_count_7d"] == 0).all()


def test_online_lookup_returns_latest_values(demo):
    from features.store import online_features

    config, paths = demo["config"], demo["paths"]
    examples = read_table(paths.consolidated)
    user = int(examples.user_id.value_counts().index[0])
    ad = int(examples.ad_id.value_counts().index[0])
    got = online_features(config, paths, [{"user_id": user, "ad_id": ad}])
    mine = examples[examples.user_id == user]
    last = mine.event_timestamp.max()
    week = mine[mine.event_timestamp > last - pd.Timedelta(days=7)]
    assert got["user_click_count_7d"] == [int(week.mask_click.sum())]
    assert got["user_click_positives_7d"] == [int(week.label_click.sum())]
    day = mine[mine.event_timestamp > last - pd.Timedelta(days=1)]
    assert got["user_click_count_1d"] == [int(day.mask_click.sum())]
    unknown = online_features(config, paths, [{"user_id": -12345, "ad_id": -1}])
    assert unknown["user_click_count_7d"] == [None]


def test_rerun_of_a_date_replaces_its_partition(demo, spark):
    from pipelines.consolidate import ingest_and_consolidate

    config, paths = demo["config"], demo["paths"]
    before = read_table(paths.consolidated)
    day = sorted(before.date.unique())[1]
    nxt = str(dt.date.fromisoformat(day) + dt.timedelta(days=1))
    mtimes = {f: f.stat().st_mtime_ns for f in paths.consolidated.rglob("*.parquet")}
    res = ingest_and_consolidate(config, paths, start=day, end=nxt)
    assert res["partitions"] == [day]
    # only that day's files were rewritten; every other day's files are the same files, untouched
    again = {f: f.stat().st_mtime_ns for f in paths.consolidated.rglob("*.parquet")}
    changed = {f for f in set(mtimes) | set(again) if mtimes.get(f) != again.get(f)}
    assert changed and all(f"date={day}" in str(f) for f in changed), sorted(map(str, changed))[:5]
    assert all(r["balanced"] for r in res["reconciliation"])
    assert res["totals"]["rows_out"] == int((before.date == day).sum())
    assert res["totals"]["skipped"] == len(before) - res["totals"]["rows_out"]
    after = read_table(paths.consolidated)
    assert len(after) == len(before) and after["example_id"].is_unique
    cols = S.consolidated_columns(config)
    a = after[cols].sort_values("example_id").reset_index(drop=True)
    b = before[cols].sort_values("example_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_dtype=False, check_categorical=False)


def test_data_docs_and_raw_suites(demo):
    cons = demo["summary"]["stages"]["consolidate"]
    suites = cons["validation"]
    assert {"raw_feed_log", "raw_search_log", "raw_video_log", "consolidated", "consolidated_cells"} <= set(suites)
    assert all(v["success"] for v in suites.values())
    assert all(v["expectations"] > 0 for v in suites.values())
    from pathlib import Path

    assert Path(cons["paths"]["data_docs"]).is_file()
    # the run's one Data Docs build rendered every suite's result of this run
    site = Path(cons["paths"]["data_docs"]).parent
    assert {s for s in suites if list((site / "validations" / s / cons["run_id"]).rglob("*.html"))} == set(suites)


def test_feast_cross_check_agrees_and_catches_a_wrong_value(demo, tmp_path):
    """The training set's bulk (entity, instant) join agrees with Feast get_historical_features on
    a sample; one shifted count makes the check fail instead of passing silently."""
    from types import SimpleNamespace

    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.feast_jobs import TrainingSetMismatch, feast_cross_check

    config, paths = demo["config"], demo["paths"]
    assert demo["summary"]["stages"]["training_set"]["feast_check"]["mismatches"] == 0
    assert feast_cross_check(config, paths, 200)["mismatches"] == 0
    ts = read_table(paths.training_set)
    ts["user_click_count_7d"] += 1
    (tmp_path / "ts").mkdir()
    pq.write_table(pa.Table.from_pandas(ts, preserve_index=False), tmp_path / "ts" / "part.parquet")
    wrong = SimpleNamespace(training_set=tmp_path / "ts", feast_repo=paths.feast_repo, workdir=paths.workdir)
    with pytest.raises(TrainingSetMismatch, match="user_click_count_7d"):
        feast_cross_check(config, wrong, 200)


def _sorted(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    frame = frame.assign(date=frame["date"].astype(str)) if "date" in frame else frame
    return frame.sort_values(keys, kind="stable").reset_index(drop=True)[sorted(frame.columns)]


def test_a_days_run_recomputes_that_day_only_and_equals_the_whole_table(demo, spark):
    """Issue 34: a run over one day reads that day's events and the longest window before it,
    replaces that day's folders of the aggregates and the training set, keeps every other day
    (a windowed teacher reads its whole window from the training set), equals what the whole
    recompute wrote, and loads the online store from that day on."""
    from pipelines.aggregates import build_aggregates
    from pipelines.feast_jobs import build_training_set, materialize

    config, paths = demo["config"], demo["paths"]
    agg_names = [a.name for a in config.features.aggregates]
    assert all((paths.aggregate(n) / f"date={config.time_range.start}").is_dir() for n in agg_names)  # kept by day
    before_ts = read_table(paths.training_set)
    before_agg = {n: read_table(paths.aggregate(n)) for n in agg_names}
    days = sorted(before_ts["date"].astype(str).unique())
    day = days[len(days) // 2]
    nxt = str(dt.date.fromisoformat(day) + dt.timedelta(days=1))

    aggs = build_aggregates(config, paths, start=day, end=nxt)
    ts = build_training_set(config, paths, start=day, end=nxt, check_rows=50)
    online = materialize(config, paths, start=day, end=nxt)

    # the kept days after it whose trailing windows (7 days at most) read it are recomputed too
    later = [d for d in days if day < d <= str(dt.date.fromisoformat(day) + dt.timedelta(days=7))]
    for name in agg_names:
        got = aggs["aggregates"][name]
        assert (got["mode"], got["days"], got["removed_days"]) == ("days", [day, *later], [])
        after = read_table(paths.aggregate(name))
        assert got["rows_written"] == int((after["date"].astype(str).isin([day, *later])).sum()) > 0
        keys = [got["entity"], "event_timestamp"]
        pd.testing.assert_frame_equal(_sorted(after, keys), _sorted(before_agg[name], keys), check_dtype=False,
                                      check_categorical=False)
    assert (ts["mode"], ts["days"], ts["recomputed_later_days"]) == ("days", [day, *later], later)
    assert ts["rows_written"] == int((before_ts["date"].astype(str).isin([day, *later])).sum())
    assert ts["rows"] == len(before_ts) and ts["feast_check"]["mismatches"] == 0
    after_ts = read_table(paths.training_set)
    assert sorted(after_ts["date"].astype(str).unique()) == days
    pd.testing.assert_frame_equal(_sorted(after_ts, ["example_id"]), _sorted(before_ts, ["example_id"]),
                                  check_dtype=False, check_categorical=False)
    assert online["start"].startswith(day)


def test_a_day_whose_rows_are_gone_loses_its_folder_and_no_other(spark, tmp_path):
    from pyspark.sql import functions as F

    from pipelines.day_tables import write_days

    root = tmp_path / "table"
    frame = spark.createDataFrame([(i, f"2026-01-0{1 + i % 3}") for i in range(30)], ["x", "date"])
    whole = write_days(frame, root, None)
    assert whole["mode"] == "whole" and whole["days"] == ["2026-01-01", "2026-01-02", "2026-01-03"]
    window = (dt.datetime(2026, 1, 2), dt.datetime(2026, 1, 4))
    day2 = write_days(frame.where(F.col("date") == "2026-01-02").withColumn("x", F.col("x") + 100), root, window)
    assert (day2["mode"], day2["days"], day2["removed_days"]) == ("days", ["2026-01-02", "2026-01-03"], ["2026-01-03"])
    got = read_table(root)
    assert sorted(got["date"].astype(str).unique()) == ["2026-01-01", "2026-01-02"]
    assert sorted(got.loc[got["date"].astype(str) == "2026-01-02", "x"]) == [101, 104, 107, 110, 113, 116, 119, 122, 125, 128]
    assert len(got) == 20
    # a table in the flat layout of an older version is rewritten whole, never mixed with day folders
    flat = tmp_path / "flat"
    frame.drop("date").write.parquet(str(flat))
    assert write_days(frame, flat, window)["mode"] == "whole"
    assert len(read_table(flat)) == 30


def test_a_late_change_to_an_earlier_day_recomputes_the_kept_days_that_read_it(demo, spark, tmp_path):
    """Issue 34 (bad input): files that arrive late, or a backfill out of order, re-run an earlier
    day while later days are kept. The later days whose trailing windows read it are recomputed
    with it (and the run says which), so the table equals a whole recompute on the new events."""
    import shutil

    from pipelines.aggregates import build_aggregates

    config, paths = demo["config"], demo["paths"]
    work = paths_for(config, tmp_path / "wd")
    shutil.copytree(paths.consolidated, work.consolidated)
    build_aggregates(config, work)  # every day, kept by day
    days = sorted(p.name.split("=", 1)[1] for p in work.consolidated.glob("date=*"))
    day = days[2]
    # the day's feed events change upstream (here: they are gone), and the day is run again
    shutil.rmtree(work.consolidated / f"date={day}" / "domain=feed")
    nxt = str(dt.date.fromisoformat(day) + dt.timedelta(days=1))
    got = build_aggregates(config, work, start=day, end=nxt)
    reach = max(max(a.window_hours()) for a in config.features.aggregates) // 24  # 7 days
    later = [d for d in days if day < d <= str(dt.date.fromisoformat(day) + dt.timedelta(days=reach))]
    assert later and all(v == later for v in got["recomputed_later_days"].values())
    whole = paths_for(config, tmp_path / "whole")
    shutil.copytree(work.consolidated, whole.consolidated)
    build_aggregates(config, whole)
    for agg in config.features.aggregates:
        assert got["aggregates"][agg.name]["days"] == [day, *later]
        keys = [got["aggregates"][agg.name]["entity"], "event_timestamp"]
        pd.testing.assert_frame_equal(_sorted(read_table(work.aggregate(agg.name)), keys),
                                      _sorted(read_table(whole.aggregate(agg.name)), keys),
                                      check_dtype=False, check_categorical=False)
