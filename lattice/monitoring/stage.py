"""The `monitor` stage: the prediction log joined with the labels that have arrived, per-cell
series, drift, rules, report.

    <workdir>/prediction_log/  ⋈  <workdir>/consolidated/ (labels + masks)
      -> <workdir>/monitoring/metrics.parquet   per (domain, objective, model_version, period)
      -> <workdir>/monitoring/drift.parquet     per (domain, dense feature, period): PSI vs the training window
      -> <workdir>/monitoring/summary.json      this summary (the stage's return value)
      -> <workdir>/monitoring/report.html
      -> <workdir>/monitoring/rules_state.json  the rules' cooldown / de-duplication memory
      -> MLflow: one run `monitor` with every cell's series (step = period index)

The series cover every logged period in [start, end) (all of the log when unset), so a re-run
recomputes the periods whose labels arrived since: a period's figures change as its labels
mature, and the rules only count a period once it has `min_positives` labels.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.dataset as ds

from lattice.config import PlatformConfig
from lattice.data import schema as S
from lattice.monitoring import cells as C
from lattice.monitoring import report as R
from lattice.monitoring import rules as rules_mod
from lattice.monitoring.join import join_labels, labels_known_at, read_labels, read_log, utc
from lattice.monitoring.compact import compact
from lattice.monitoring.records import log_dir, monitor_summary
from lattice.paths import Paths

log = logging.getLogger(__name__)
REFERENCE_ROWS = 200_000  # training rows read per domain for drift: deciles need far fewer


def monitoring_dir(paths: Paths) -> Path:
    return paths.workdir / "monitoring"


def _training_reference(config: PlatformConfig, paths: Paths) -> pd.DataFrame:
    path = paths.consolidated
    if not path.exists() or not any(path.rglob("*.parquet")):
        return pd.DataFrame()
    data = ds.dataset(str(path), format="parquet", partitioning="hive", exclude_invalid_files=True)
    dense = S.dense_columns(config)
    cols = [c for c in ["domain", *dense, *(S.present_column(c) for c in dense)] if c in data.schema.names]
    flt = ds.field("split") == "train" if "split" in data.schema.names else None
    frame = data.to_table(columns=cols, filter=flt).to_pandas()
    if frame.empty or frame.groupby("domain").size().max() <= REFERENCE_ROWS:
        return frame
    # a random sample per domain (the table is ordered by date: its first rows are its oldest days)
    return frame.sample(frac=1.0, random_state=0).groupby("domain").head(REFERENCE_ROWS)


def _period_index(cells: pd.DataFrame, first: pd.Timestamp | None, period: str) -> pd.DataFrame:
    """Period index = periods since the first logged one (MLflow's step)."""
    if cells.empty:
        return cells
    step = pd.Timedelta(hours=rules_mod.PERIOD_HOURS[period])
    return cells.assign(period_index=((cells["period_start"] - first) / step).round().astype(int))


def _log_mlflow(config: PlatformConfig, paths: Paths, cells: pd.DataFrame, drift: pd.DataFrame) -> str:
    from mlflow.entities import Metric

    from lattice.registry import ModelRegistry

    reg = ModelRegistry(config, paths)
    run = reg.client.create_run(reg.experiment_id, run_name="monitor", tags={"lattice.stage": "monitor"})
    now = int(time.time() * 1000)
    metrics = []
    for r in cells.itertuples():
        for name in ("ne", "auc", "calibration", "prediction_mean", "label_rate", "count"):
            v = float(getattr(r, name))
            if math.isfinite(v):
                metrics.append(Metric(f"online.{r.domain}.{r.objective}.v{r.model_version}.{name}", v, now, int(r.period_index)))
    for r in drift.itertuples():
        if math.isfinite(r.psi):
            metrics.append(Metric(f"drift.{r.domain}.{r.feature}.psi", float(r.psi), now, int(r.period_index)))
    for i in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics per batch
        reg.client.log_batch(run.info.run_id, metrics=metrics[i:i + 1000])
    reg.client.set_terminated(run.info.run_id)
    return run.info.run_id


def _records(frame: pd.DataFrame) -> list[dict]:
    out = json.loads(frame.drop(columns=["period_start"], errors="ignore").to_json(orient="records"))
    return out


def monitor(config: PlatformConfig, paths: Paths, start: str | dt.datetime | None = None,
            end: str | dt.datetime | None = None, period: str = "day", mlflow: bool = True,
            lookback_days: int | None = None, **_: Any) -> dict[str, Any]:
    """The monitor stage; returns its summary (also `<workdir>/monitoring/summary.json`), whose
    `tripped` lists the rules to act on (rule, cell, model version, figures, reason).
    `lookback_days` with `end`: read [end - lookback, end), so a daily run's rules see the periods
    before its own day (a rule may need several periods in a row)."""
    if lookback_days is not None and end is not None and start is None:
        start = (pd.Timestamp(end) - pd.Timedelta(days=int(lookback_days))).strftime("%Y-%m-%d")
    if period not in C.PERIOD_FREQ:
        raise ValueError(f"period must be one of {sorted(C.PERIOD_FREQ)}, got {period!r}")
    dense = S.dense_columns(config)
    for i, rule in enumerate(config.monitoring.rules):
        if rule.kind == "drift" and rule.feature != "*" and rule.feature not in dense:
            raise ValueError(f"monitoring.rules[{i}].feature: {rule.feature!r} is not a dense feature column; "
                             f"use one of {dense} or '*'")
    t0 = time.perf_counter()
    out_dir = monitoring_dir(paths)
    out_dir.mkdir(parents=True, exist_ok=True)
    mon = config.monitoring

    # serving's Arrow parts -> parquet, here off the serving cores (a no-op for parquet parts)
    compacted = compact(log_dir(paths.workdir), mon.prediction_log.compression)
    if compacted["parts"]:
        log.info("monitor: compacted %d Arrow part(s), %d row(s), into parquet in %d hour folder(s)",
                 compacted["parts"], compacted["rows"], compacted["folders"])
    logged = read_log(paths.workdir, start, end)
    # labels count as known at the run's end (a past day re-monitored sees what was known then)
    as_of = pd.Timestamp(end) if end is not None else pd.Timestamp.now(tz="UTC")
    if not logged.empty:
        logged = C.add_period(logged, period)
    if not logged.empty:
        ids = logged["request_id"].dropna().astype(str).unique().tolist()
        labels = labels_known_at(config, read_labels(config, paths.consolidated, ids), as_of)
        joined = join_labels(config, logged, labels)
    else:
        joined = logged
    first = logged["period_start"].min() if not logged.empty else None
    cells = _period_index(C.cell_table(config, joined), first, period)
    drift = pd.DataFrame()
    if not logged.empty:
        reference = C.reference_values(config, _training_reference(config, paths))
        drift = _period_index(C.drift_table(config, logged, reference), first, period)

    findings, healthy = rules_mod.check(mon.rules, cells, drift, period)
    state_path = out_dir / "rules_state.json"
    tripped, needs_person, state = rules_mod.decide(findings, healthy, rules_mod.load_state(state_path), mon.cooldown_hours)
    rules_mod.save_state(state_path, state)

    if not cells.empty:
        cells.to_parquet(out_dir / "metrics.parquet", index=False)
    if not drift.empty:
        drift.to_parquet(out_dir / "drift.parquet", index=False)
    summary: dict[str, Any] = {
        "stage": "monitor", "config": config.name, "period": period,
        "start": None if start is None else str(start), "end": None if end is None else str(end),
        "labels_as_of": str(utc(as_of)),
        "compacted": compacted,
        "rows": {"logged": int(len(logged)), "joined": int(joined["joined"].sum()) if len(joined) else 0,
                 "pending": int((~joined["joined"]).sum()) if len(joined) else 0},
        "cells": _records(cells), "drift": _records(drift),
        "tripped": tripped, "needs_person": needs_person,
        "suppressed": len(findings) - len(tripped) - len(needs_person),
        "metrics": str(out_dir / "metrics.parquet") if not cells.empty else None,
        "report": str(out_dir / "report.html"), "mlflow_run_id": None,
    }
    if mlflow and not cells.empty:
        try:
            summary["mlflow_run_id"] = _log_mlflow(config, paths, cells, drift)
        except Exception as exc:  # the figures are on disk either way; say why MLflow has none
            log.warning("monitor: logging the series to MLflow failed: %s", exc)
            summary["mlflow_error"] = f"{type(exc).__name__}: {exc}"
    R.write(out_dir / "report.html", summary, cells, drift, mon.rules)
    summary["seconds"] = round(time.perf_counter() - t0, 2)
    # written whole then renamed: a server scraping it meanwhile reads the old or the new one
    tmp = out_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1, default=str))
    tmp.replace(monitor_summary(paths.workdir))
    log.info("monitor: %d prediction(s), %d joined, %d cell-period(s), %d rule(s) tripped, %d need a person",
             summary["rows"]["logged"], summary["rows"]["joined"], len(cells), len(tripped), len(needs_person))
    return summary
