"""The Feast stages: apply the repo built from the config, build the point-in-time training set
(checked against `get_historical_features`), and materialize the latest values into the online store.

    spark-submit pipelines/feast_jobs.py --config configs/demo.yaml --job apply|training_set|materialize
"""

from __future__ import annotations

import datetime as dt
import time

if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lattice.config import PlatformConfig
from lattice.data import schema as S
from lattice.paths import Paths

from features.repo import definitions, feature_refs, write_repo
from features.store import feast_experimental, get_store
from pipelines.aggregates import aggregate_path, entity_column, feature_columns, longest_window
from pipelines.consolidate import run_window
from pipelines.day_tables import DAY, day_layout, reach_forward, write_days
from pipelines.spark import get_spark


def feast_apply(config: PlatformConfig, paths: Paths, start: str | None = None, end: str | None = None,
                domains: list[str] | None = None, master: str | None = None) -> dict:
    """Entities and feature views; each registered model version adds its own FeatureService
    (`lattice.registry.stages.register`)."""
    t0 = time.perf_counter()
    write_repo(config, paths)
    store = get_store(config, paths)
    with feast_experimental():  # SparkSource objects are built here and again when read back
        store.apply(definitions(config, paths))
        views = [v.name for v in store.list_feature_views()]
    return {
        "stage": "feast_apply", "repo": str(paths.feast_repo), "project": store.project,
        "entities": [e.name for e in store.list_entities()],
        "feature_views": views,
        "feature_services": sorted(s.name for s in store.list_feature_services()),
        "online_store": config.feature_store.online_store, "offline_store": config.feature_store.offline_store,
        "timings": {"total": round(time.perf_counter() - t0, 3)},
    }


def _join_keys(config: PlatformConfig) -> list[str]:
    used = {a.entity for a in config.features.aggregates}
    return [f.column for f in config.entity_features if f.name in used]


def build_training_set(config: PlatformConfig, paths: Paths, start: str | None = None, end: str | None = None,
                       domains: list[str] | None = None, master: str | None = None,
                       check_rows: int | None = None) -> dict:
    """Consolidated rows ⋈ aggregate features, point-in-time, as parquet in `paths.training_set`.

    Feast's `get_historical_features` pairs every example with every feature row of its entity
    and then keeps the latest one at or before the example's time: its cost grows with the
    square of an entity's event count, and ids are Zipf-distributed (the head user or ad carries
    about a tenth of all events: 10^10 pairs at 1M rows). The aggregate tables hold a row at the
    instant of every event of the entity (`pipelines.aggregates`), so for an example that latest
    row is the one at exactly its own time: the bulk join is an equi-join on (entity, time), linear
    in rows. `get_historical_features` then scores a random sample of the examples through Feast
    (the config's feature views: the model version, and so its service, comes later) and the stage fails if any value differs.
    """
    from pyspark.sql import functions as F

    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    spark = get_spark(master, config=config)
    if not paths.consolidated.is_dir():
        raise FileNotFoundError(f"no consolidated table at {paths.consolidated}; run the consolidate stage first")
    examples = spark.read.parquet(str(paths.consolidated))
    # a window replaces its days of a table kept by day; a first run, a flat table of an older
    # version or a domain subset is built whole (a window alone would leave only its days)
    window = run_window(config, start, end)
    if window is not None and (domains or not day_layout(paths.training_set)):
        window = None
    later: list[str] = []
    if window is not None and config.features.aggregates:
        # the kept days after the run's whose aggregates the run recomputed (pipelines.aggregates)
        reach = max(longest_window(a) for a in config.features.aggregates)
        window, later = reach_forward(paths.training_set, window, reach)
    if window:
        examples = examples.where((F.col("event_timestamp") >= F.lit(window[0])) & (F.col("event_timestamp") < F.lit(window[1])))
    if domains:
        examples = examples.where(F.col("domain").isin(domains))
    agg_cols = S.aggregate_columns(config)
    joined = examples
    for agg in config.features.aggregates:
        key = entity_column(config, agg)
        cols = [c for c, _ in feature_columns(agg)]
        feats = (spark.read.parquet(str(aggregate_path(paths, agg.name)))
                 .select(F.col(key).alias("_k"), F.col("event_timestamp").alias("_t"), *cols))
        joined = (joined.join(feats, (F.col(key) == F.col("_k")) & (F.col("event_timestamp") == F.col("_t")), "left")
                  .drop("_k", "_t"))
    # an example without a key (or, impossible by construction, without a row) has seen no events
    joined = joined.fillna(0, subset=agg_cols) if agg_cols else joined
    t = time.perf_counter()
    cols = S.consolidated_columns(config) + agg_cols
    # sorted within each file: a shuffle delivers rows in no fixed order, and the trainer's
    # (seeded) shuffle must start from the same order on every run and machine
    # kept by day: a run over a data interval replaces its days and keeps the rest of the table
    # (a windowed teacher reads its whole window from it)
    written = write_days(joined.select(*cols).sortWithinPartitions("event_timestamp", "example_id"), paths.training_set,
                         window)
    table = spark.read.parquet(str(paths.training_set))
    rows = table.count()
    rows_written = table.where(F.col(DAY).isin(written["days"])).count() if written["mode"] == "days" else rows
    timings["join_and_write"] = time.perf_counter() - t
    check = {"rows": 0}
    if agg_cols and rows:
        t = time.perf_counter()
        check = feast_cross_check(config, paths, config.feature_store.training_check_rows if check_rows is None else check_rows)
        timings["feast_check"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t0
    return {"stage": "training_set", "rows": rows, "rows_written": rows_written, **written, "recomputed_later_days": later,
            "path": str(paths.training_set), "columns": cols,
            "aggregate_columns": agg_cols,
            "feast_check": check, "timings": {k: round(v, 3) for k, v in timings.items()}}


class TrainingSetMismatch(AssertionError):
    pass


def feast_cross_check(config: PlatformConfig, paths: Paths, n: int) -> dict:
    """`get_historical_features` (Feast, the configured offline store) for a random sample of
    training-set rows must return the very values the training set holds."""
    import numpy as np
    import pyarrow.dataset as ds

    if n <= 0:
        return {"rows": 0}
    keys = _join_keys(config)
    agg_cols = S.aggregate_columns(config)
    table = ds.dataset(str(paths.training_set), format="parquet").to_table(columns=[*keys, "event_timestamp", *agg_cols])
    rng = np.random.default_rng(0)
    pick = rng.choice(table.num_rows, size=min(n, table.num_rows), replace=False)
    sample = table.take(pick).to_pandas()
    for k in keys:  # Feast needs every join key; a missing one joins as -1 (no row: no events)
        sample[k] = sample[k].fillna(-1).astype("int64")
    sample = sample.drop_duplicates([*keys, "event_timestamp"]).reset_index(drop=True)
    store = get_store(config, paths)
    service = feature_refs(config)
    entity_df = sample[[*keys, "event_timestamp"]]
    if config.feature_store.offline_store == "spark":
        spark = get_spark(config=config)
        spark.createDataFrame(entity_df).createOrReplaceTempView("lattice_check_entities")
        with feast_experimental():
            got = store.get_historical_features(entity_df="SELECT * FROM lattice_check_entities", features=service).to_df()
    else:
        got = store.get_historical_features(entity_df=entity_df, features=service).to_df()
    import pandas as pd

    for frame in (sample, got):  # Spark hands back naive UTC times, the parquet reader aware ones
        frame["event_timestamp"] = pd.to_datetime(frame["event_timestamp"], utc=True)
    merged = sample.merge(got, on=[*keys, "event_timestamp"], suffixes=("", "_feast"), how="left")
    bad = {}
    for c in agg_cols:
        want = merged[c].to_numpy(float)
        have = merged[f"{c}_feast"].fillna(0).to_numpy(float)
        diff = int((~np.isclose(want, have)).sum())
        if diff:
            bad[c] = diff
    if bad or len(merged) != len(sample):
        raise TrainingSetMismatch(
            f"Feast get_historical_features disagrees with the training set on {len(sample)} sampled rows: "
            f"differing values per column {bad}; the aggregate tables may be stale: re-run the aggregates stage")
    return {"rows": len(sample), "mismatches": 0}


def _relay_feast_driver(store) -> None:
    """Feast's Spark offline store starts its own session from feature_store.yaml's spark_conf:
    start that JVM here, with the same settings, so its output is relayed by level too, and with
    the JVM's own address lookup (SPARK_LOCAL_IP, an environment variable no conf key sets) on
    the driver's bind address, as get_spark does."""
    offline = store.config.offline_store
    if getattr(offline, "type", None) == "spark" and offline.spark_conf:
        import os

        from pyspark import SparkConf

        if offline.spark_conf.get("spark.driver.bindAddress"):
            os.environ.setdefault("SPARK_LOCAL_IP", offline.spark_conf["spark.driver.bindAddress"])

        from pipelines.jvm_log import launch_relayed

        launch_relayed(SparkConf().setAll(list(offline.spark_conf.items())))


def materialize(config: PlatformConfig, paths: Paths, start: str | None = None, end: str | None = None,
                domains: list[str] | None = None, master: str | None = None) -> dict:
    """Load the latest aggregate values per entity into the online store (SQLite / Redis): the
    rows from the run's first day on (incremental), or every row without a date range."""
    t0 = time.perf_counter()
    if not config.features.aggregates:
        return {"stage": "materialize", "feature_views": [], "timings": {"total": 0.0}}
    store = get_store(config, paths)
    _relay_feast_driver(store)
    # from the run's first day on (a day's run loads that day's values; a backfilled old day loads
    # every later day again too, so the store ends at the newest values, not the backfilled ones)
    window = run_window(config, start, end)
    first = window[0].date() if window is not None else config.time_range.start - dt.timedelta(days=1)
    lo = dt.datetime.combine(first, dt.time(), tzinfo=dt.timezone.utc)
    hi = dt.datetime.combine(config.time_range.end, dt.time(), tzinfo=dt.timezone.utc) + dt.timedelta(days=1)
    views = [a.name for a in config.features.aggregates]
    with feast_experimental():
        store.materialize(start_date=lo, end_date=hi, feature_views=views)
    return {"stage": "materialize", "feature_views": views, "online_store": config.feature_store.online_store,
            "start": lo.isoformat(), "end": hi.isoformat(), "timings": {"total": round(time.perf_counter() - t0, 3)}}


if __name__ == "__main__":
    import sys

    from pipelines.jobmain import main

    jobs = {"apply": feast_apply, "training_set": build_training_set, "materialize": materialize}
    argv = sys.argv[1:]
    name = argv[argv.index("--job") + 1] if "--job" in argv else "apply"
    if "--job" in argv:
        i = argv.index("--job")
        argv = argv[:i] + argv[i + 2:]
    raise SystemExit(main(jobs[name], f"Feast stage {name}", argv=argv))
