"""Point-in-time entity aggregates: for every aggregate in the config (entity, objective,
windows) and every event of the entity, the count of labeled events, the positives and the rate
over each trailing window, computed ONLY from events strictly before the row's time.

Output per aggregate (`paths.aggregates/<name>/`, parquet, Feast-ready):

    <entity column> int64, event_timestamp timestamp(us), created timestamp(us),
    <name>_<stat>_<window> ...   (count/positives int64, rate double)

A row is written at the time of every event of the entity (so an example at time t finds the
row at exactly t, which counts events in [t - window, t)), plus a closing row 1 microsecond
after the entity's last event of each day that also counts that event: the latest one is the
value online serving needs. (A last event at 23:59:59.999999 gets no closing row: it would
fall on the next day, which its own run owns.)

The table is kept by day (`date=` folders, `pipelines.day_tables`). A run over a data interval
recomputes only its days, reading the consolidated events of those days and of the longest
window before them (what their trailing windows count), so a day's cost does not grow with
the history; a run without one recomputes every day. A run over days that precede kept days (a
backfill out of order, a re-run for late files) also recomputes the kept days whose trailing
windows read its days (`day_tables.reach_forward`), and says which.

    spark-submit pipelines/aggregates.py --config configs/demo.yaml
"""

from __future__ import annotations

import datetime as dt
import time

if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lattice.config import PlatformConfig
from lattice.config.schema import AggregateFeature
from lattice.data import schema as S
from lattice.paths import Paths

from pipelines.day_tables import DAY, day_layout, reach_forward, window_days, write_days
from pipelines.spark import get_spark

HOUR_US = 3_600_000_000


def aggregate_path(paths: Paths, aggregate: str):
    return paths.aggregate(aggregate)


def entity_column(config: PlatformConfig, agg: AggregateFeature) -> str:
    return next(f.column for f in config.features.sparse if f.name == agg.entity)


def feature_columns(agg: AggregateFeature) -> list[tuple[str, str]]:
    """(column, kind) in `lattice.data.schema.aggregate_columns` order; kind is 'int' or 'rate'."""
    return S.aggregate_feature_columns(agg)


def compute_aggregate(config: PlatformConfig, agg: AggregateFeature, examples):
    """examples: the consolidated table (Spark). Returns the aggregate's feature rows.

    A sum over a sliding range frame (`rangeBetween(-w, -1)`) makes Spark re-aggregate the frame
    for every row: O(rows x events in the window) per entity, quadratic for the Zipf head (a hot
    ad with 10^5 events a week). Instead every event enters the window at its time with +(n, p)
    and leaves it at time + w with -(n, p); one running sum per window over the time-ordered
    entries and exits (an O(n) frame) then gives, at each event, the events in [t - w, t)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    key = entity_column(config, agg)
    lab, mask = S.label_column(agg.objective), S.mask_column(agg.objective)
    # one row per (entity, instant): several events at the same instant must not see each other
    events = (examples.where(F.col(key).isNotNull())
              .groupBy(key, "event_timestamp")
              .agg(F.sum(mask).cast("long").alias("_n"), F.sum(F.col(lab) * F.col(mask)).cast("long").alias("_p"))
              .select(key, F.unix_micros("event_timestamp").alias("_t"), F.to_date("event_timestamp").alias("_d"),
                      "_n", "_p"))
    windows = list(zip(agg.windows, agg.window_hours()))
    zero = F.lit(0).cast("long")

    def record(t, kind: int, deltas: dict[str, tuple]):
        cols = [key, t.alias("_t"), F.lit(kind).alias("_kind"), F.col("_n").alias("_own_n"), F.col("_p").alias("_own_p")]
        for w, _ in windows:
            n, p = deltas.get(w, (zero, zero))
            cols += [n.alias(f"_n_{w}"), p.alias(f"_p_{w}")]
        return events.select(*cols)

    # kind 0: an event (and a query at its instant); kind 1: an event leaving one window.
    # At equal times queries sort first, so an exit at exactly t (an event at t - w, still inside
    # [t - w, t)) is not yet applied when the event at t reads its sums.
    parts = [record(F.col("_t"), 0, {w: (F.col("_n"), F.col("_p")) for w, _ in windows})]
    for w, hours in windows:
        parts.append(record(F.col("_t") + hours * HOUR_US, 1, {w: (-F.col("_n"), -F.col("_p"))}))
    # closing row 1us after the entity's last event of each day: includes that event (online
    # serving reads the latest); kept only inside the same day, which a day's own run writes
    closing = (events.groupBy(key, "_d").agg((F.max("_t") + 1).alias("_t"))
               .where(F.to_date(F.timestamp_micros("_t")) == F.col("_d"))
               .select(key, "_t", F.lit(0).alias("_kind"), zero.alias("_own_n"), zero.alias("_own_p"),
                       *[c for w, _ in windows for c in (zero.alias(f"_n_{w}"), zero.alias(f"_p_{w}"))]))
    rows = parts[0]
    for part in parts[1:] + [closing]:
        rows = rows.unionByName(part)
    running = Window.partitionBy(key).orderBy("_t", "_kind").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    cols = []
    for w, _ in windows:
        # the running sum includes the row's own entry: strictly before means subtracting it
        n = (F.sum(f"_n_{w}").over(running) - F.col("_own_n")).cast("long")
        p = (F.sum(f"_p_{w}").over(running) - F.col("_own_p")).cast("long")
        stats = {"count": n, "positives": p, "rate": F.when(n > 0, p / n).otherwise(F.lit(0.0)).cast("double")}
        cols += [stats[s].alias(f"{agg.name}_{s}_{w}") for s in agg.statistics]
    out = rows.select(key, "_t", "_kind", *cols).where(F.col("_kind") == 0)
    out = out.select(key, F.timestamp_micros("_t").alias("event_timestamp"), *[c for c in out.columns if c.startswith(agg.name)])
    return (out.withColumn("created", F.col("event_timestamp"))
            .withColumn(DAY, F.date_format("event_timestamp", "yyyy-MM-dd")))


def longest_window(agg: AggregateFeature) -> dt.timedelta:
    return dt.timedelta(hours=max(agg.window_hours()))


def build_aggregates(config: PlatformConfig, paths: Paths, start: str | None = None, end: str | None = None,
                     domains: list[str] | None = None, master: str | None = None) -> dict:
    """Every aggregate, for the days of [start, end) (reading those days' events and the longest
    window before them), or for every day without a range. A domain subset recomputes whole (its
    aggregates count that subset's events only)."""
    from pyspark.sql import functions as F

    from pipelines.consolidate import run_window

    t0 = time.perf_counter()
    spark = get_spark(master, config=config)
    out: dict = {"stage": "aggregates", "aggregates": {}, "timings": {}}
    if not config.features.aggregates:
        return out
    if not paths.consolidated.is_dir():
        raise FileNotFoundError(f"no consolidated table at {paths.consolidated}; run the consolidate stage first")
    examples = spark.read.parquet(str(paths.consolidated))
    if domains:
        examples = examples.where(F.col("domain").isin(domains))
    window = None if domains else run_window(config, start, end)
    for agg in config.features.aggregates:
        t = time.perf_counter()
        target = aggregate_path(paths, agg.name)
        source, rows = examples, None
        days, later = reach_forward(target, window, longest_window(agg))
        if later:
            out.setdefault("recomputed_later_days", {})[agg.name] = later
        if days is not None and day_layout(target):
            # the window's events and the history its trailing windows reach back into; each
            # day folder then holds the rows at that day's instants
            lo = days[0] - longest_window(agg)
            source = examples.where((F.col("event_timestamp") >= F.lit(lo)) & (F.col("event_timestamp") < F.lit(days[1])))
            rows = F.col(DAY).isin(window_days(days))
        df = compute_aggregate(config, agg, source)
        written = write_days(df if rows is None else df.where(rows), target, days)
        table = spark.read.parquet(str(target))
        n = table.count()
        day_rows = table.where(F.col(DAY).isin(written["days"])).count() if written["mode"] == "days" else n
        out["aggregates"][agg.name] = {"rows": n, "rows_written": day_rows, "path": str(target),
                                       "entity": entity_column(config, agg),
                                       "columns": [c for c, _ in feature_columns(agg)], **written}
        out["timings"][agg.name] = round(time.perf_counter() - t, 3)
    out["timings"]["total"] = round(time.perf_counter() - t0, 3)
    return out


if __name__ == "__main__":
    from pipelines.jobmain import main

    raise SystemExit(main(build_aggregates, "point-in-time entity aggregates from the consolidated table"))
