"""The monitor's per-cell figures as Prometheus gauges on the server's `/metrics`.

Labels arrive days after a prediction, so online NE and calibration are computed by the monitor
stage (`lattice monitor`, the monitor DAG), not on the request path. Its last result lies in
`<workdir>/monitoring/summary.json`; this collector reads it at scrape time (again only when the
file changed) and exposes, per (domain, objective, model version), the figures of the latest
period whose labels have arrived:

    lattice_online_ne / _calibration / _auc / _label_rate / _prediction_mean
    lattice_online_labels, lattice_online_positives, lattice_online_pending
    lattice_online_period_start_seconds   the period those figures describe
    lattice_monitor_age_seconds           how old the monitor's result is (a stalled monitor shows here)
    lattice_monitor_rules_tripped         rules its last run tripped

Prometheus then alerts and graphs on them beside the live counters (PromQL in docs/monitoring.md).
A summary that cannot be read exposes only its age and a count of read failures: a scrape never
fails because of it.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

LABELS = ["domain", "objective", "version"]
# summary field -> (gauge name suffix, help)
FIGURES = {
    "ne": ("ne", "Online normalized entropy of the cell's latest labelled period (monitor stage)"),
    "calibration": ("calibration", "Online calibration (sum p / sum y) of the cell's latest labelled period"),
    "auc": ("auc", "Online AUC of the cell's latest labelled period"),
    "label_rate": ("label_rate", "Observed label rate of the cell's latest labelled period"),
    "prediction_mean": ("prediction_mean", "Mean served probability over the labelled predictions of that period"),
    "count": ("labels", "Predictions of that period whose label is known"),
    "positives": ("positives", "Positive labels of that period"),
    "pending": ("pending", "Predictions of that period still waiting for their example"),
}


def latest_cells(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (domain, objective, model_version): the latest period with at least one known label
    (a period whose labels have not arrived says nothing about the model yet)."""
    best: dict[tuple, dict[str, Any]] = {}
    for c in cells:
        if not c.get("count"):
            continue
        key = (c["domain"], c["objective"], c["model_version"])
        if key not in best or str(c["period"]) > str(best[key]["period"]):
            best[key] = c
    return [best[k] for k in sorted(best)]


class MonitorFigures(Collector):
    def __init__(self, summary_path: Path):
        self.path = Path(summary_path)
        self._mtime: float | None = None
        self._summary: dict[str, Any] | None = None
        self.read_errors = 0

    def _load(self) -> dict[str, Any] | None:
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            self._mtime, self._summary = None, None
            return None
        if mtime != self._mtime:
            try:
                self._summary = json.loads(self.path.read_text())
            except (OSError, ValueError) as exc:  # a half-written or damaged file: keep serving metrics
                self.read_errors += 1
                if self.read_errors == 1:
                    log.warning("monitor figures: %s cannot be read (%s); its gauges are left out", self.path, exc)
                self._summary = None
            self._mtime = mtime
        return self._summary

    def collect(self) -> Iterator[GaugeMetricFamily]:
        summary = self._load()
        errors = GaugeMetricFamily("lattice_monitor_read_errors", "Times the monitor's summary.json could not be read")
        errors.add_metric([], self.read_errors)
        yield errors
        if self._mtime is None:
            return  # no monitor run yet: no figures, and no age to report
        age = GaugeMetricFamily("lattice_monitor_age_seconds", "Seconds since the monitor stage last wrote its result")
        age.add_metric([], max(0.0, time.time() - self._mtime))
        yield age
        if summary is None:
            return
        tripped = GaugeMetricFamily("lattice_monitor_rules_tripped", "Monitoring rules tripped by the monitor's last run")
        tripped.add_metric([], len(summary.get("tripped") or []))
        yield tripped
        latest = latest_cells(summary.get("cells") or [])
        families = {f: GaugeMetricFamily(f"lattice_online_{name}", doc, labels=LABELS) for f, (name, doc) in FIGURES.items()}
        start = GaugeMetricFamily("lattice_online_period_start_seconds",
                                  "Start (Unix time, UTC) of the period the lattice_online_* figures describe",
                                  labels=LABELS)
        for c in latest:
            labels = [str(c["domain"]), str(c["objective"]), str(c["model_version"])]
            for field, fam in families.items():
                value = c.get(field)
                if value is None or (isinstance(value, float) and math.isnan(value)):
                    continue  # e.g. AUC of a period with one class: no sample rather than a made-up one
                fam.add_metric(labels, float(value))
            begins = pd.Timestamp(str(c["period"]))  # "2026-01-05" (day) or "2026-01-05T03:00Z" (hour)
            start.add_metric(labels, (begins.tz_localize("UTC") if begins.tzinfo is None else begins).timestamp())
        yield from families.values()
        yield start
