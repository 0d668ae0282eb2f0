"""The Feast stages: apply the repo built from the config, build the point-in-time training set
with `get_historical_features`, and materialize the latest values into the online store.

    spark-submit pipelines/feast_jobs.py --config configs/demo.yaml --job apply|training_set|materialize
"""

from __future__ import annotations

import datetime as dt
import shutil
import time

if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lattice.config import PlatformConfig
from lattice.data import schema as S
from lattice.paths import Paths

from features.repo import definitions, feature_service_name, write_repo
from features.store import get_store
from pipelines.consolidate import run_window
from pipelines.spark import get_spark


def feast_apply(config: PlatformConfig, paths: Paths, start: str | None = None, end: str | None = None,
                domains: list[str] | None = None, master: str | None = None, version: int = 1) -> dict:
    t0 = time.perf_counter()
    write_repo(config, paths)
    store = get_store(config, paths)
    objs = definitions(config, paths, version)
    store.apply(objs)
    return {
        "stage": "feast_apply", "repo": str(paths.feast_repo), "project": store.project,
        "entities": [e.name for e in store.list_entities()],
        "feature_views": [v.name for v in store.list_feature_views()],
        "feature_services": sorted(s.name for s in store.list_feature_services()),
        "feature_service": feature_service_name(config, version),
        "online_store": config.feature_store.online_store, "offline_store": config.feature_store.offline_store,
        "timings": {"total": round(time.perf_counter() - t0, 3)},
    }


def _join_keys(config: PlatformConfig) -> list[str]:
    used = {a.entity for a in config.features.aggregates}
    return [f.column for f in config.entity_features if f.name in used]


def build_training_set(config: PlatformConfig, paths: Paths, start: str | None = None, end: str | None = None,
                       domains: list[str] | None = None, master: str | None = None, version: int = 1) -> dict:
    """Consolidated rows ⋈ aggregate features, point-in-time (Feast), as parquet in
    `paths.training_set`. Feast sees only (example_id, event_timestamp, join keys); Spark joins the
    features back to the full rows by example_id."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    spark = get_spark(master)
    if not paths.consolidated.is_dir():
        raise FileNotFoundError(f"no consolidated table at {paths.consolidated}; run the consolidate stage first")
    examples = spark.read.parquet(str(paths.consolidated))
    window = run_window(config, start, end)
    if window:
        examples = examples.where((F.col("event_timestamp") >= F.lit(window[0])) & (F.col("event_timestamp") < F.lit(window[1])))
    if domains:
        examples = examples.where(F.col("domain").isin(domains))
    agg_cols = S.aggregate_columns(config)
    keys = _join_keys(config)
    staging = paths.workdir / "_training_features"
    if agg_cols:
        # Feast sees each distinct (join keys, time) once: rows sharing them get the same features
        # (and Feast's PIT join would drop the repeats). A missing key joins as -1: no events.
        keyed = examples.select("*", *[F.coalesce(k, F.lit(-1)).alias(f"_key_{k}") for k in keys])
        entities = keyed.select(*[F.col(f"_key_{k}").alias(k) for k in keys], "event_timestamp").distinct()
        store = get_store(config, paths)
        service = store.get_feature_service(feature_service_name(config, version))
        t = time.perf_counter()
        if config.feature_store.offline_store == "spark":
            # the entity frame stays in Spark: Feast's Spark store takes a query over a temp view
            entities.createOrReplaceTempView("lattice_training_entities")
            job = store.get_historical_features(entity_df="SELECT * FROM lattice_training_entities", features=service)
            feats = job.to_spark_df().select(*keys, "event_timestamp", *agg_cols)
            timings["get_historical_features"] = time.perf_counter() - t
        else:
            entity_df = entities.toPandas()
            timings["entity_df"] = time.perf_counter() - t
            t = time.perf_counter()
            fdf = store.get_historical_features(entity_df=entity_df, features=service).to_df()[[*keys, "event_timestamp", *agg_cols]]
            timings["get_historical_features"] = time.perf_counter() - t
            t = time.perf_counter()
            if staging.exists():
                shutil.rmtree(staging)
            staging.mkdir(parents=True)
            pq.write_table(pa.Table.from_pandas(fdf, preserve_index=False), staging / "features.parquet",
                           coerce_timestamps="us", allow_truncated_timestamps=True)
            feats = spark.read.parquet(str(staging))
        feats = feats.select(*[F.col(k).alias(f"_key_{k}") for k in keys], "event_timestamp",
                             *[F.col(c).cast("double" if "_rate_" in c else "long").alias(c) for c in agg_cols])
        joined = keyed.join(feats, on=[*[f"_key_{k}" for k in keys], "event_timestamp"], how="left")
        # an entity with no earlier row within the TTL (or no key) has seen no events
        joined = joined.fillna(0, subset=agg_cols)
        timings["stage_features"] = time.perf_counter() - t
    else:
        joined = examples
    t = time.perf_counter()
    cols = S.consolidated_columns(config) + agg_cols
    joined.select(*cols).write.mode("overwrite").parquet(str(paths.training_set))
    rows = spark.read.parquet(str(paths.training_set)).count()
    timings["write"] = time.perf_counter() - t
    if staging.exists():
        shutil.rmtree(staging)
    timings["total"] = time.perf_counter() - t0
    return {"stage": "training_set", "rows": rows, "path": str(paths.training_set), "columns": cols,
            "aggregate_columns": agg_cols, "feature_service": feature_service_name(config, version),
            "timings": {k: round(v, 3) for k, v in timings.items()}}


def materialize(config: PlatformConfig, paths: Paths, start: str | None = None, end: str | None = None,
                domains: list[str] | None = None, master: str | None = None) -> dict:
    """Load the latest aggregate values per entity into the online store (SQLite / Redis)."""
    t0 = time.perf_counter()
    if not config.features.aggregates:
        return {"stage": "materialize", "feature_views": [], "timings": {"total": 0.0}}
    store = get_store(config, paths)
    lo = dt.datetime.combine(config.time_range.start, dt.time(), tzinfo=dt.timezone.utc) - dt.timedelta(days=1)
    hi = dt.datetime.combine(config.time_range.end, dt.time(), tzinfo=dt.timezone.utc) + dt.timedelta(days=1)
    views = [a.name for a in config.features.aggregates]
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
