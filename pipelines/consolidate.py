"""Ingest every source, validate, and write the consolidated example table (the contract in
`lattice.data.schema`) partitioned by date and domain, plus the quarantine of rejected rows.

    spark-submit pipelines/consolidate.py --config configs/demo.yaml [--master local[2]] [--start D --end D]
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import shutil
import time
import uuid
from collections import defaultdict
from pathlib import Path

if __name__ == "__main__":  # spark-submit runs this file as a script
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lattice.config import PlatformConfig
from lattice.data import schema as S
from lattice.data.split import describe as describe_split
from lattice.data.split import hash_split_sql
from lattice.paths import Paths

from pipelines import ingest, sources, validate
from pipelines.explain import explain
from pipelines.spark import get_spark

UNKNOWN = "(unknown)"
log = logging.getLogger(__name__)


def new_run_id() -> str:
    return f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"


def run_window(config: PlatformConfig, start: str | None, end: str | None) -> tuple[dt.datetime, dt.datetime] | None:
    """[start, end) as naive UTC datetimes, or None for the whole configured time range."""
    if start is None and end is None:
        return None
    lo = dt.date.fromisoformat(start) if start else config.time_range.start
    hi = dt.date.fromisoformat(end) if end else config.time_range.end
    if hi <= lo:
        raise ValueError(f"--end ({hi}) must be after --start ({lo}); the end date is exclusive")
    return dt.datetime.combine(lo, dt.time()), dt.datetime.combine(hi, dt.time())


def remove_stale_partitions(root: Path, window: tuple[dt.datetime, dt.datetime] | None, domains: list[str],
                            written: set[tuple[str, str]]) -> list[str]:
    """Delete the (date, domain) partitions inside this run's scope (its window, or the whole
    table without one, and its domains) that the run did not write. Dynamic overwrite replaces
    only the partitions a run produces rows for: a date whose source rows are gone (moved,
    deleted, all quarantined) would otherwise keep its old rows."""
    removed: list[str] = []
    if not root.is_dir():
        return removed
    for day_dir in sorted(root.glob("date=*")):
        day = day_dir.name.split("=", 1)[1]
        try:
            d = dt.date.fromisoformat(day)
        except ValueError:
            continue
        if window and not (window[0].date() <= d < window[1].date()):
            continue
        for part in sorted(day_dir.glob("domain=*")):
            domain = part.name.split("=", 1)[1]
            if domain in domains and (day, domain) not in written:
                shutil.rmtree(part)
                removed.append(f"date={day}/domain={domain}")
        if not any(day_dir.iterdir()):
            day_dir.rmdir()
    return removed


def _check_domains(config: PlatformConfig, domains: list[str] | None) -> list[str]:
    if not domains:
        return config.domain_names
    unknown = [d for d in domains if d not in config.domain_names]
    if unknown:
        raise ValueError(f"unknown domain(s) {unknown}; the config declares {config.domain_names}")
    return list(domains)


def ingest_and_consolidate(config: PlatformConfig, paths: Paths, start: str | None = None, end: str | None = None,
                           domains: list[str] | None = None, master: str | None = None, run_id: str | None = None) -> dict:
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    run_id = run_id or new_run_id()
    window = run_window(config, start, end)
    run_domains = _check_domains(config, domains)
    paths.ensure()
    spark = get_spark(master, config=config)
    timings["spark_session"] = time.perf_counter() - t0

    # ---- read every source (errors that stop the run come first: missing files, lost columns)
    t = time.perf_counter()
    raws, source_info = [], {}
    lo_day, hi_day = (window[0].date(), window[1].date()) if window else (config.time_range.start, config.time_range.end)
    for src in config.sources:
        # a date-partitioned source lists only the run's days; the others are read whole and
        # filtered by event time in `ingest.tag`
        chosen = sources.select_files(paths, src, lo_day, hi_day)
        info = {"files": len(chosen.files), "format": src.format, "date_partitioned": chosen.partitioned, "rows_in": 0}
        if chosen.empty_files:  # 0-byte part files: 0 rows each, listed so that nothing is silent
            info["empty_files"] = chosen.empty_files
            log.warning("source %s: %d empty (0-byte) file(s) read as 0 rows: %s", src.name, len(chosen.empty_files),
                        ", ".join(chosen.empty_files[:3]))
        if chosen.partitioned:
            info.update(files_by_day=chosen.by_day, empty_days=chosen.empty_days)
        source_info[src.name] = info
        if not chosen.files:
            info.update(columns=[], new_columns=[])
            continue
        cols = sources.source_columns(src, chosen.files, config.training.split.column if config.training.split.kind == "column" else None)
        added = sources.check_schema_drift(paths, src, cols, record=False)
        raws.append(ingest.read_raw(spark, src, chosen.files, cols))
        info.update(columns=cols, new_columns=added)
    timings["resolve_sources"] = time.perf_counter() - t
    empty_days = sorted({d for info in source_info.values() for d in info.get("empty_days", [])})
    if not raws:
        return _empty_run(config, paths, run_id, window, run_domains, source_info, empty_days, timings, t0)

    # ---- raw suites (row-level: informative, the same rows are quarantined below)
    t = time.perf_counter()
    validator = validate.Validator(paths.validation)
    results: list[validate.SuiteResult] = []
    for raw in raws:
        sample = validate.to_pandas(validate.raw_frame(raw.source, raw.frame), validate.raw_sample_rows())
        res = validator.run(f"raw_{raw.source.name}", sample, validate.raw_expectations(config, raw.source), "pandas", run_id)
        res.rows = len(sample)
        results.append(res)
    timings["validate_raw"] = time.perf_counter() - t

    # ---- tag rows, find duplicates, keep everything once in memory/disk
    t = time.perf_counter()
    tagged = None
    for raw in raws:
        part = ingest.tag(config, raw, window, run_domains)
        tagged = part if tagged is None else tagged.unionByName(part)
    parts = int(spark.conf.get("spark.sql.shuffle.partitions"))
    tagged = tagged.repartition(parts, "date", "domain")
    # Rows sharing an id: under a source's declared key, one event logged twice (the first copy
    # is kept, the rest quarantined); without a key, identical raw rows, which are distinct
    # events (two people with one profile, two identical impressions in an hour): each copy
    # gets an id of its own and is counted. Hash partitioning by (date, domain) already clusters
    # this window, so it costs a local sort only.
    keyed = [src.name for src in config.sources if src.key]
    occurrence = F.row_number().over(Window.partitionBy("date", "domain", "example_id").orderBy("_file", "_raw"))
    tagged = tagged.withColumn("_occurrence", occurrence).withColumn("_keyed", F.col("_source").isin(keyed) if keyed else F.lit(False))
    dup = F.col("_keyed") & (F.col("_occurrence") > 1)
    tagged = tagged.withColumn("_detail", F.when(F.col("_reason").isNull() & dup, F.concat(F.lit("key example_id="), F.col("example_id")))
                               .otherwise(F.col("_detail")))
    tagged = tagged.withColumn("_reason", F.when(F.col("_reason").isNull() & dup, F.lit(ingest.DUPLICATE)).otherwise(F.col("_reason")))
    tagged = tagged.withColumn("_identical", (~F.col("_keyed") & (F.col("_occurrence") > 1)).cast("int"))
    tagged = tagged.withColumn("example_id", F.when(F.col("_keyed"), F.col("example_id"))
                               .otherwise(F.expr(ingest.occurrence_id_sql("example_id", "_occurrence"))))
    # kind hash decides from the final id; the other kinds came from the data in `ingest.tag`
    tagged = tagged.withColumn("split", F.coalesce(F.col("split"), F.expr(hash_split_sql(config))))
    # one row order on disk, whatever order the shuffle delivered: the same data trains the same model
    tagged = tagged.sortWithinPartitions("date", "domain", "event_timestamp", "example_id")
    tagged = tagged.withColumn("_status", F.when(~F.col("_in_scope"), "skipped")
                               .when(F.col("_reason").isNull(), "out").otherwise("quarantined"))
    tagged = tagged.persist(StorageLevel.MEMORY_AND_DISK)

    objs = config.objective_names
    aggs = [F.count(F.lit(1)).alias("rows")]
    for o in objs:
        lab, mask = F.col(S.label_column(o)), F.col(S.mask_column(o))
        aggs += [F.sum(mask).alias(f"labeled_{o}"), F.sum(lab).alias(f"positives_{o}"),
                 F.sum((lab > mask).cast("int")).alias(f"label_without_mask_{o}"),
                 F.sum((~lab.isin(0, 1) | ~mask.isin(0, 1)).cast("int")).alias(f"bad_label_values_{o}")]
    aggs.append(F.sum(F.col("example_id").isNull().cast("int")).alias("null_ids"))
    aggs.append(F.sum("_identical").alias("identical_rows"))
    aggs += [F.sum((F.col("split") == k).cast("int")).alias(f"split_{k}") for k in ("train", "validation", "test")]
    aggs.append(F.min("_detail").alias("example"))
    grouped = (tagged.groupBy("_source", F.coalesce("domain", F.lit(UNKNOWN)).alias("domain"), "date", "_status", "_reason")
               .agg(*aggs).collect())
    # distinct ids of the rows to write, per domain (a duplicate would survive dedup only by a bug)
    distinct_ids = {r["domain"]: r["n"] for r in tagged.where(F.col("_status") == "out").groupBy("domain")
                    .agg(F.countDistinct("example_id").alias("n")).collect()}
    timings["ingest_tag"] = time.perf_counter() - t

    in_by_domain: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    reasons: dict[str, int] = defaultdict(int)
    reasons_by_source: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    cell_counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    split_rows: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    out_dates: set[str] = set()
    for r in grouped:
        d = r["domain"]
        in_by_domain[d]["rows_in"] += r["rows"]
        in_by_domain[d][r["_status"]] += r["rows"]
        source_info[r["_source"]]["rows_in"] = source_info[r["_source"]].get("rows_in", 0) + r["rows"]
        if r["_status"] == "quarantined":
            reasons[r["_reason"]] += r["rows"]
            reasons_by_source[r["_source"]][r["_reason"]] += r["rows"]
        if r["_status"] == "out":
            source_info[r["_source"]]["identical_rows"] = source_info[r["_source"]].get("identical_rows", 0) + (r["identical_rows"] or 0)
            for k in ("train", "validation", "test"):
                split_rows[d][k] += r[f"split_{k}"] or 0
            out_dates.add(r["date"])
            cell_counts[d]["rows"] += r["rows"]
            cell_counts[d]["null_ids"] += r["null_ids"] or 0
            for o in objs:
                for k in ("labeled", "positives", "label_without_mask", "bad_label_values"):
                    cell_counts[d][f"{k}_{o}"] += r[f"{k}_{o}"] or 0
    for d, n in distinct_ids.items():
        cell_counts[d]["distinct_ids"] = n

    # ---- table-level suites on exactly the rows about to be written
    t = time.perf_counter()
    good = tagged.where(F.col("_status") == "out").select(*S.consolidated_columns(config))
    sample = validate.to_pandas(good, validate.raw_sample_rows())
    results.append(validator.run("consolidated", sample, validate.consolidated_expectations(config), "pandas", run_id))
    cells = validate.cell_table(config, cell_counts, run_domains)
    results.append(validator.run("consolidated_cells", cells, validate.table_expectations(), "pandas", run_id))
    results[-2].rows, results[-1].rows = len(sample), len(cells)
    timings["validate_consolidated"] = time.perf_counter() - t
    fatal = [r for r in results[-2:] if not r.success]
    losses = explain(config, [{"source": r["_source"], "domain": r["domain"], "status": r["_status"], "reason": r["_reason"],
                       "rows": r["rows"], "example": r["example"]} for r in grouped],
                     run_domains, str(paths.quarantine / f"run_id={run_id}"))
    for line in losses:
        log.warning("consolidate: %s", line)
    # the raw suites are not fatal (their rows are quarantined one by one), but what they found is
    # said where the user looks: one line per failed expectation with its count
    raw_findings = [f"raw suite {r.suite}: {f['expectation']}{' on ' + f['column'] if f.get('column') else ''}: {f['why']}"
                    for r in results[:-2] if not r.success for f in r.failures]
    for line in raw_findings:
        log.warning("consolidate: %s (those rows are quarantined with their reasons)", line)

    t = time.perf_counter()
    docs = validator.build_docs()  # one Data Docs build for every suite of this run
    timings["data_docs"] = time.perf_counter() - t

    # ---- quarantine (always written: it is what a failed run is debugged from)
    t = time.perf_counter()
    bad = tagged.where(F.col("_status") == "quarantined").select(
        F.lit(run_id).alias("run_id"), F.col("_source").alias("source"), F.col("_reason").alias("reason"),
        F.col("_detail").alias("detail"), F.col("_raw").alias("raw"), F.col("_file").alias("file"),
        F.coalesce("domain", F.lit(UNKNOWN)).alias("domain"), "example_id", F.current_timestamp().alias("quarantined_at"))
    bad.coalesce(1).write.mode("append").partitionBy("run_id").parquet(str(paths.quarantine))
    timings["write_quarantine"] = time.perf_counter() - t

    summary = {
        "stage": "consolidate", "run_id": run_id, "config": config.name,
        "window": {"start": str(window[0].date()) if window else str(config.time_range.start),
                   "end": str(window[1].date()) if window else str(config.time_range.end)},
        "domains": run_domains, "sources": source_info,
        "split": {"kind": config.training.split.kind, "rule": describe_split(config),
                  "rows": {d: dict(v) for d, v in sorted(split_rows.items())}},
        "quarantine_reasons": dict(sorted(reasons.items())), "losses": losses, "raw_suite_findings": raw_findings,
        "quarantine_by_source": {k: dict(v) for k, v in reasons_by_source.items()},
        "validation": {r.suite: {"success": r.success, "expectations": r.evaluated, "rows_checked": r.rows,
                                 "unexpected": r.unexpected, "failures": r.failures} for r in results},
        "cells": cells.to_dict(orient="records"),
        "paths": {"consolidated": str(paths.consolidated), "quarantine": str(paths.quarantine),
                  "validation": str(paths.validation), "data_docs": docs},
    }
    if fatal:
        tagged.unpersist()
        summary["status"] = "failed"
        summary["timings"] = {k: round(v, 3) for k, v in timings.items()}
        _write_json(paths.validation / f"run-{run_id}.json", summary)
        raise validate.ValidationFailed(fatal, docs, losses)

    # ---- the table itself: replaces exactly the (date, domain) partitions of this run
    t = time.perf_counter()
    good.write.mode("overwrite").partitionBy("date", "domain").parquet(str(paths.consolidated))
    written_pairs = {(str(r["date"]), r["domain"]) for r in grouped if r["_status"] == "out"}
    removed = remove_stale_partitions(paths.consolidated, window, run_domains, written_pairs)
    timings["write_consolidated"] = time.perf_counter() - t
    tagged.unpersist()

    # ---- reconciliation, with rows out and quarantined read back from disk
    t = time.perf_counter()
    written: dict[str, int] = defaultdict(int)
    dirs = [str(paths.consolidated / f"date={day}" / f"domain={d}") for day in sorted(out_dates) for d in run_domains]
    dirs = [x for x in dirs if Path(x).is_dir()]
    if dirs:
        back = spark.read.option("basePath", str(paths.consolidated)).parquet(*dirs)
        for r in back.groupBy("domain").count().collect():
            written[r["domain"]] = r["count"]
    quarantined: dict[str, int] = defaultdict(int)
    qdir = paths.quarantine / f"run_id={run_id}"
    if qdir.is_dir():
        for r in spark.read.parquet(str(qdir)).groupBy("domain").count().collect():
            quarantined[r["domain"]] = r["count"]
    recon = []
    for d in sorted(set(in_by_domain) | set(written) | set(quarantined), key=lambda x: (x == UNKNOWN, x)):
        row = {"domain": d, "rows_in": in_by_domain[d]["rows_in"], "rows_out": written[d],
               "quarantined": quarantined[d], "skipped": in_by_domain[d]["skipped"]}
        row["balanced"] = row["rows_in"] == row["rows_out"] + row["quarantined"] + row["skipped"]
        recon.append(row)
    total = {k: sum(r[k] for r in recon) for k in ("rows_in", "rows_out", "quarantined", "skipped")}
    total["balanced"] = all(r["balanced"] for r in recon)
    timings["reconcile"] = time.perf_counter() - t
    for raw in raws:
        sources.check_schema_drift(paths, raw.source, raw.columns, record=True)

    timings["total"] = time.perf_counter() - t0
    summary.update({"status": "ok", "reconciliation": recon, "totals": total, "partitions": sorted(out_dates),
                    "removed_partitions": removed, "raw_rows_read": total["rows_in"], "empty_days": empty_days,
                    "timings": {k: round(v, 3) for k, v in timings.items()}})
    _write_json(paths.validation / f"run-{run_id}.json", summary)
    return summary


def _empty_run(config: PlatformConfig, paths: Paths, run_id: str, window, run_domains: list[str], source_info: dict,
               empty_days: list[str], timings: dict[str, float], t0: float) -> dict:
    """No source has a file for the run's days: an empty run, recorded as such (not a failure, so
    later days still run). Partitions of the window are removed: their files are gone."""
    removed = remove_stale_partitions(paths.consolidated, window, run_domains, set())
    timings["total"] = time.perf_counter() - t0
    summary = {
        "stage": "consolidate", "run_id": run_id, "config": config.name, "status": "ok", "empty": True,
        "window": {"start": str(window[0].date()) if window else str(config.time_range.start),
                   "end": str(window[1].date()) if window else str(config.time_range.end)},
        "domains": run_domains, "sources": source_info, "empty_days": empty_days, "raw_rows_read": 0,
        "quarantine_reasons": {}, "losses": [], "raw_suite_findings": [], "quarantine_by_source": {}, "validation": {},
        "cells": [], "reconciliation": [], "partitions": [], "removed_partitions": removed,
        "totals": {"rows_in": 0, "rows_out": 0, "quarantined": 0, "skipped": 0, "balanced": True},
        "split": {"kind": config.training.split.kind, "rule": describe_split(config), "rows": {}},
        "paths": {"consolidated": str(paths.consolidated), "quarantine": str(paths.quarantine),
                  "validation": str(paths.validation), "data_docs": None},
        "timings": {k: round(v, 3) for k, v in timings.items()},
    }
    log.warning("consolidate: no raw file for %s; recorded as empty day(s)", ", ".join(empty_days) or "the window")
    _write_json(paths.validation / f"run-{run_id}.json", summary)
    return summary


def _write_json(path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, default=str))


if __name__ == "__main__":
    from pipelines.jobmain import main

    raise SystemExit(main(ingest_and_consolidate, "ingest, validate and consolidate every source of a platform config"))
