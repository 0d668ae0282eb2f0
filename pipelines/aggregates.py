"""Point-in-time entity aggregates: for every aggregate in the config (entity, objective,
windows) and every event of the entity, the count of labeled events, the positives and the rate
over each trailing window, computed ONLY from events strictly before the row's time.

Output per aggregate (`paths.aggregates/<name>/`, parquet, Feast-ready):

    <entity column> int64, event_timestamp timestamp(us), created timestamp(us),
    <name>_<stat>_<window> ...   (count/positives int64, rate double)

A row is written at the time of every event of the entity (so an example at time t finds the
row at exactly t, which counts events in [t - window, t)), plus one closing row 1 microsecond
after the entity's last event that also counts that event: the value online serving needs.

    spark-submit pipelines/aggregates.py --config configs/demo.yaml
"""

from __future__ import annotations

import time

if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lattice.config import PlatformConfig
from lattice.config.schema import AggregateFeature
from lattice.data import schema as S
from lattice.paths import Paths

from pipelines.spark import get_spark

HOUR_US = 3_600_000_000


def aggregate_path(paths: Paths, aggregate: str):
    return paths.aggregates / aggregate


def entity_column(config: PlatformConfig, agg: AggregateFeature) -> str:
    return next(f.column for f in config.features.sparse if f.name == agg.entity)


def feature_columns(agg: AggregateFeature) -> list[tuple[str, str]]:
    """(column, kind) in `lattice.data.schema.aggregate_columns` order; kind is 'int' or 'rate'."""
    return [(f"{agg.name}_{stat}_{w}", "rate" if stat == "rate" else "int") for w in agg.windows for stat in agg.statistics]


def compute_aggregate(config: PlatformConfig, agg: AggregateFeature, examples):
    """examples: the consolidated table (Spark). Returns the aggregate's feature rows."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    key = entity_column(config, agg)
    lab, mask = S.label_column(agg.objective), S.mask_column(agg.objective)
    # one row per (entity, instant): several events at the same instant must not see each other
    events = (examples.where(F.col(key).isNotNull())
              .groupBy(key, "event_timestamp")
              .agg(F.sum(mask).cast("long").alias("_n"), F.sum(F.col(lab) * F.col(mask)).cast("long").alias("_p"))
              .withColumn("_t", F.unix_micros("event_timestamp")))
    last = Window.partitionBy(key).orderBy("_t")
    events = events.withColumn("_next", F.lead("_t").over(last))
    # closing row 1us after the entity's last event: includes that event (for online serving)
    closing = (events.where(F.col("_next").isNull())
               .select(key, (F.col("_t") + 1).alias("_t"), F.lit(0).cast("long").alias("_n"), F.lit(0).cast("long").alias("_p")))
    rows = events.select(key, "_t", "_n", "_p").unionByName(closing)
    cols = []
    for w, hours in zip(agg.windows, agg.window_hours()):
        # strictly before: the frame ends 1us before the row's own instant
        frame = Window.partitionBy(key).orderBy("_t").rangeBetween(-hours * HOUR_US, -1)
        n, p = F.coalesce(F.sum("_n").over(frame), F.lit(0)), F.coalesce(F.sum("_p").over(frame), F.lit(0))
        stats = {"count": n.cast("long"), "positives": p.cast("long"),
                 "rate": F.when(n > 0, p / n).otherwise(F.lit(0.0)).cast("double")}
        cols += [stats[s].alias(f"{agg.name}_{s}_{w}") for s in agg.statistics]
    out = rows.select(key, F.timestamp_micros("_t").alias("event_timestamp"), *cols)
    return out.withColumn("created", F.col("event_timestamp"))


def build_aggregates(config: PlatformConfig, paths: Paths, start: str | None = None, end: str | None = None,
                     domains: list[str] | None = None, master: str | None = None) -> dict:
    """Recompute every aggregate over the whole consolidated table (history before `start`
    matters to the windows, so a date range does not narrow the input)."""
    from pyspark.sql import functions as F

    t0 = time.perf_counter()
    spark = get_spark(master)
    out: dict = {"stage": "aggregates", "aggregates": {}, "timings": {}}
    if not config.features.aggregates:
        return out
    if not paths.consolidated.is_dir():
        raise FileNotFoundError(f"no consolidated table at {paths.consolidated}; run the consolidate stage first")
    examples = spark.read.parquet(str(paths.consolidated))
    if domains:
        examples = examples.where(F.col("domain").isin(domains))
    for agg in config.features.aggregates:
        t = time.perf_counter()
        df = compute_aggregate(config, agg, examples)
        target = aggregate_path(paths, agg.name)
        df.write.mode("overwrite").parquet(str(target))
        n = spark.read.parquet(str(target)).count()
        out["aggregates"][agg.name] = {"rows": n, "path": str(target), "entity": entity_column(config, agg),
                                       "columns": [c for c, _ in feature_columns(agg)]}
        out["timings"][agg.name] = round(time.perf_counter() - t, 3)
    out["timings"]["total"] = round(time.perf_counter() - t0, 3)
    return out


if __name__ == "__main__":
    from pipelines.jobmain import main

    raise SystemExit(main(build_aggregates, "point-in-time entity aggregates from the consolidated table"))
