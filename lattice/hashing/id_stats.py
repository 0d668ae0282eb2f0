"""Per-id statistics of the training window, computed with Spark: the pass over the table that
every fitted scheme starts from.

The ids are the ones the model sees: the loader (`lattice.data.loader.RowEncoder`) casts a sparse
column to int64 and feeds no id where the value is null, so here the column is cast to long and
null rows are left out. Every statistic is an integer count, summed exactly in any order, so the
numbers, and the fit built from them, do not depend on how Spark partitions the work; the
floating-point representation for clustering is derived from them on the driver.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lattice.config import PlatformConfig
from lattice.data import schema as S
from lattice.data.split import hash_fraction_sql, hash_split_sql

if TYPE_CHECKING:
    from lattice.data.window import DaySplits


@dataclass(frozen=True)
class Window:
    """The training split as a whole: its size, dates and label counts per (domain, objective)."""

    rows: int
    start: str | None
    end: str | None
    split_column: bool
    """Whether the table stores `split` (else the hash rule decided, as the loader does)."""
    labelled: np.ndarray
    """(domains, objectives) rows carrying each objective's label."""
    positives: np.ndarray
    """(domains, objectives) positives among them."""

    def rates(self) -> tuple[np.ndarray, np.ndarray]:
        """Label rate per (domain, objective) and per objective over all domains; an empty cell
        takes its objective's rate (and an objective without labels 0.5: it carries no signal)."""
        overall = np.where(self.labelled.sum(0) > 0, self.positives.sum(0) / np.maximum(self.labelled.sum(0), 1), 0.5)
        cell = np.where(self.labelled > 0, self.positives / np.maximum(self.labelled, 1), overall[None, :])
        return cell, overall


@dataclass(frozen=True)
class IdStats:
    """Counts per distinct id of one sparse column in the training split, ids ascending."""

    column: str
    ids: np.ndarray
    """(n,) int64, ascending."""
    counts: np.ndarray
    """(n,) int64 training rows per id."""
    domain_rows: np.ndarray | None
    """(n, domains) rows per domain; None when only counts were asked for."""
    labelled: np.ndarray | None
    """(n, domains, objectives) rows labelled per (domain, objective)."""
    positives: np.ndarray | None
    """(n, objectives) positives per objective."""
    present_rows: int
    """Training rows with a value in the column (the rows the model looks an id up for)."""
    seconds: float


def train_frame(spark, config: PlatformConfig, table: Path, days: "DaySplits | None" = None):
    """The table's training rows, read as training reads them: a windowed run's train days (and,
    when it holds out only a share of its newest day, the rest of that day: `DaySplits.split_of`),
    else the stored split (`split == 'train'`)."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(str(table))
    if days is not None:
        return known_labels(df, config, days.cutoff()).where(window_train_sql(df, days)), "split" in df.columns
    if "split" in df.columns:
        return df.where(F.col("split") == "train"), True
    # a table written before the split column existed: the loader applies the hash rule
    return df.where(F.expr(hash_split_sql(config)) == "train"), False


def row_date_sql(df):
    """Each row's date as YYYY-MM-DD, as `lattice.data.window.row_dates` reads it: the `date`
    partition or column, else the event time's UTC day (the session's time zone is UTC)."""
    from pyspark.sql import functions as F

    if "date" in df.columns:
        return F.substring(F.col("date").cast("string"), 1, 10)
    if "event_timestamp" in df.columns:
        return F.date_format(F.col("event_timestamp"), "yyyy-MM-dd")
    raise ValueError("a windowed fit (training.window) needs each example's date: the table has no `date` "
                     "partition or column and no `event_timestamp`; rebuild it with `lattice features CONFIG`")


def known_labels(df, config: PlatformConfig, cutoff):
    """The Spark twin of `lattice.data.label_time.mask_at_cutoff`: each delayed objective's label
    and mask as a run training at `cutoff` knows them (training.label_delay), so that `learned`
    hashing clusters ids on the labels the network trains on, not on conversions that arrived
    after the run. Objectives without an attribution window, and a cutoff of None, pass through."""
    from pyspark.sql import functions as F

    from lattice.config.timing import attribution_window
    from lattice.data.label_time import delayed_objectives, main_mode

    if cutoff is None:
        return df
    mode = main_mode(config.training.label_delay)
    # as text in the session's time zone (UTC): a Python datetime would be read in the driver's local zone
    naive = cutoff.astimezone(dt.timezone.utc).replace(tzinfo=None) if cutoff.tzinfo else cutoff
    at = F.to_timestamp(F.lit(naive.strftime("%Y-%m-%d %H:%M:%S")))
    for o in delayed_objectives(config):
        lab, mask, known = S.label_column(o), S.mask_column(o), S.known_column(o)
        if lab not in df.columns or mask not in df.columns:
            continue
        seconds = int(attribution_window(config, o).total_seconds())
        closes = F.col("event_timestamp") + F.expr(f"INTERVAL {seconds} SECONDS")
        if mode == "mask":  # masked while the window is open, whatever arrived already
            closed = closes <= at
            df = df.withColumn(lab, F.when(closed, F.col(lab)).otherwise(F.lit(0)).cast(df.schema[lab].dataType))
            df = df.withColumn(mask, F.when(closed, F.col(mask)).otherwise(F.lit(0)).cast(df.schema[mask].dataType))
        else:  # naive: a positive counts once known, anything else is a negative
            arrived = F.coalesce(F.col(known), closes) if known in df.columns else closes
            seen = (F.coalesce(F.col(lab), F.lit(0)) > 0) & (arrived <= at)
            df = df.withColumn(lab, seen.cast(df.schema[lab].dataType))
    return df


def window_train_sql(df, days: "DaySplits"):
    """The Spark twin of `days.split_of(dates, ids, "train")` for a run without a parent (no
    replayed or matured days: a warm start refits its parent's maps instead, lattice.hashing.refit)."""
    from pyspark.sql import functions as F

    if days.replay or days.matured:
        raise ValueError("a warm start's days (replayed or matured) take the parent's refitted maps, not a new fit")
    date = row_date_sql(df)
    train = [d for d, s in days.days.items() if s == "train"]
    keep = date.isin(train) if train else F.lit(False)
    shared = days.validation_day()
    if shared is not None and days.validation_share < 1:  # the newest day's rows not held out train too
        keep = keep | ((date == shared) & (F.expr(hash_fraction_sql()) >= F.lit(days.validation_share)))
    return keep


def _label(df, objective: str):
    from pyspark.sql import functions as F

    lab, mask = S.label_column(objective), S.mask_column(objective)
    if lab not in df.columns or mask not in df.columns:
        return F.lit(0).cast("long"), F.lit(0).cast("long")
    m = F.coalesce(F.col(mask).cast("long"), F.lit(0))
    return F.coalesce(F.col(lab).cast("long"), F.lit(0)) * m, m


def _date(df):
    """The column whose min and max give the window's dates; compared raw (a cast per row costs
    more than the whole aggregation), turned into yyyy-MM-dd on the driver."""
    from pyspark.sql import functions as F

    for name in ("date", "event_timestamp"):
        if name in df.columns:
            return F.col(name)
    return F.lit(None).cast("string")


def _day(value) -> str | None:
    if value is None:
        return None
    return value.date().isoformat() if hasattr(value, "date") else getattr(value, "isoformat", lambda: str(value))()


def window_of(df, config: PlatformConfig, split_column: bool) -> Window:
    """One aggregation by domain: rows, first and last date, label counts."""
    from pyspark.sql import functions as F

    objs, doms = config.objective_names, config.domain_names
    aggs = [F.count(F.lit(1)).alias("_n"), F.min(_date(df)).alias("_lo"), F.max(_date(df)).alias("_hi")]
    for j, o in enumerate(objs):
        pos, mask = _label(df, o)
        aggs += [F.sum(mask).alias(f"_m{j}"), F.sum(pos).alias(f"_p{j}")]
    rows = df.groupBy(F.col("domain").cast("string").alias("_dom")).agg(*aggs).collect()
    labelled = np.zeros((len(doms), len(objs)), np.int64)
    positives = np.zeros_like(labelled)
    index = {d: i for i, d in enumerate(doms)}
    for r in rows:
        if r["_dom"] in index:
            i = index[r["_dom"]]
            labelled[i] = [int(r[f"_m{j}"] or 0) for j in range(len(objs))]
            positives[i] = [int(r[f"_p{j}"] or 0) for j in range(len(objs))]
    starts = [r["_lo"] for r in rows if r["_lo"] is not None]
    ends = [r["_hi"] for r in rows if r["_hi"] is not None]
    return Window(rows=int(sum(r["_n"] for r in rows)), start=_day(min(starts)) if starts else None,
                  end=_day(max(ends)) if ends else None, split_column=split_column, labelled=labelled, positives=positives)


def id_stats(df, config: PlatformConfig, column: str, with_labels: bool) -> IdStats:
    """Counts per id of `column` (and, `with_labels`, per domain and per objective's labels)."""
    from pyspark.sql import functions as F

    t0 = time.perf_counter()
    objs, doms = config.objective_names, config.domain_names
    if column not in df.columns:  # the loader then feeds no id at all: nothing to fit
        empty = np.zeros(0, np.int64)
        return IdStats(column, empty, empty, np.zeros((0, len(doms)), np.int64) if with_labels else None,
                       np.zeros((0, len(doms), len(objs)), np.int64) if with_labels else None,
                       np.zeros((0, len(objs)), np.int64) if with_labels else None, 0, time.perf_counter() - t0)
    frame = df.select(F.col(column).cast("long").alias("_id"), F.col("domain").cast("string").alias("_dom"),
                      *[e.alias(f"_{k}{j}") for j, o in enumerate(objs) for k, e in zip("pm", _label(df, o))]
                      if with_labels else []).where(F.col("_id").isNotNull())
    aggs = [F.count(F.lit(1)).alias("_n")]
    if with_labels:
        is_dom = [F.col("_dom") == F.lit(d) for d in doms]
        aggs += [F.sum(F.when(w, 1).otherwise(0)).cast("long").alias(f"_d{i}") for i, w in enumerate(is_dom)]
        aggs += [F.sum(F.when(w, F.col(f"_m{j}")).otherwise(0)).cast("long").alias(f"_l{i}_{j}")
                 for i, w in enumerate(is_dom) for j in range(len(objs))]
        aggs += [F.sum(F.col(f"_p{j}")).cast("long").alias(f"_p{j}") for j in range(len(objs))]
    pdf = frame.groupBy("_id").agg(*aggs).toPandas()
    order = np.argsort(pdf["_id"].to_numpy(np.int64), kind="stable")
    ids = pdf["_id"].to_numpy(np.int64)[order]
    counts = pdf["_n"].to_numpy(np.int64)[order]

    def block(names: list[str]) -> np.ndarray:
        return pdf[names].to_numpy(np.int64)[order] if names else np.zeros((len(ids), 0), np.int64)

    domain_rows = labelled = positives = None
    if with_labels:
        domain_rows = block([f"_d{i}" for i in range(len(doms))])
        labelled = block([f"_l{i}_{j}" for i in range(len(doms)) for j in range(len(objs))]).reshape(len(ids), len(doms), len(objs))
        positives = block([f"_p{j}" for j in range(len(objs))])
    return IdStats(column, ids, counts, domain_rows, labelled, positives, int(counts.sum()), time.perf_counter() - t0)
