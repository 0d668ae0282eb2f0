"""`GET /metrics`: the server's health in Prometheus' text format (prometheus-client).

One `ServingMetrics` per app. With one process the metrics live in the app's own registry. With
several uvicorn workers each is its own process: `lattice serve` then sets
`PROMETHEUS_MULTIPROC_DIR` to an empty folder before the workers start, every worker's values go
to files there, and whichever worker answers /metrics sums them all (prometheus-client's
multiprocess mode), so a scrape sees the whole server, not one worker.

Per-cell series are (domain, objective): the count of predictions and the sum of probabilities
(mean = sum / count, as a Prometheus query divides them). Unknown entities (the store answered,
without this entity) and online-store errors (the store could not be read) are counted apart.
The monitor's labelled figures per cell (online NE, calibration, ...) join them as gauges
(`monitor_gauges.py`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from lattice.serving.monitor_gauges import MonitorFigures

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Set by `lattice serve` when it starts several workers. PROMETHEUS_MULTIPROC_DIR alone does not
# say so: importing Feast sets it (to a temporary folder of Feast's own) in every process.
LATTICE_MULTIPROC_ENV = "LATTICE_METRICS_MULTIPROC"
ROUTES = frozenset({"/predict", "/healthz", "/metadata", "/metrics"})
# single requests take about a millisecond, batches tens: buckets from 0.5 ms to 5 s
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


def multiprocess() -> bool:
    return os.environ.get(LATTICE_MULTIPROC_ENV) == "1" and bool(os.environ.get(MULTIPROC_ENV))


class ServingMetrics:
    def __init__(self, monitor_summary: Path | None = None) -> None:
        self.multiprocess = multiprocess()
        # multiprocess: values live in the shared folder, not in a registry of this process
        own = None if self.multiprocess else CollectorRegistry()
        self._registry = own
        # the monitor's per-cell figures, read from its summary at scrape time (same in every worker)
        self.monitor = MonitorFigures(monitor_summary) if monitor_summary is not None else None
        if own is not None and self.monitor is not None:
            own.register(self.monitor)
        self.latency = Histogram("lattice_request_duration_seconds", "Time from request to response, by route",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=own)
        self.responses = Counter("lattice_responses", "HTTP responses by route and status", ["route", "status"], registry=own)
        self.in_flight = Gauge("lattice_requests_in_flight", "Requests being handled now", registry=own,
                               multiprocess_mode="livesum")
        self.model_version = Gauge("lattice_model_version", "Registry version of the champion each worker serves",
                                   registry=own, multiprocess_mode="liveall")
        self.predictions = Counter("lattice_predictions", "Predictions served per (domain, objective) cell",
                                   ["domain", "objective"], registry=own)
        self._cells: dict[tuple[str, str], tuple] = {}  # (domain, objective) -> its two counters' children
        self.probability_sum = Counter("lattice_prediction_probability_sum",
                                       "Sum of the probabilities served per cell (mean = sum / lattice_predictions_total)",
                                       ["domain", "objective"], registry=own)
        self.unknown = Counter("lattice_unknown_entities",
                               "Entities the online store answered for without a row (no history; defaults served)",
                               ["entity"], registry=own)
        self.store_errors = Counter("lattice_online_store_errors",
                                    "Entity reads answered without the online store because it could not be read",
                                    registry=own)
        self.store_reads = Counter("lattice_online_store_reads",
                                   "Entity reads that went to the online store (the rest hit the cache or mirror)",
                                   registry=own)
        self.log_written = Counter("lattice_prediction_log_written", "Prediction-log records written", registry=own)
        self.log_dropped = Counter("lattice_prediction_log_dropped", "Prediction-log records dropped, by reason",
                                   ["reason"], registry=own)
        self.log_lag = Gauge("lattice_prediction_log_lag_seconds",
                             "Age of the oldest record in the last prediction-log write", registry=own,
                             multiprocess_mode="livemax")

    def _cell(self, domain: str, objective: str):
        """The cell's two counters. prometheus-client's `labels()` takes a lock and builds a key
        on every call (~3 us); a served cell's children are looked up once."""
        key = (domain, objective)
        got = self._cells.get(key)
        if got is None:
            got = self._cells[key] = (self.predictions.labels(domain, objective), self.probability_sum.labels(domain, objective))
        return got

    def observe_predictions(self, domains: np.ndarray, probabilities: dict[str, np.ndarray],
                            known: list[str] | None = None) -> None:
        """Per-cell count and sum for one scored batch (one inc per cell present, not per row).
        `known`: the config's domains, which every scored row has (compared as arrays; reading
        256 domain strings into Python alone cost 46 us)."""
        if len(domains) == 1:  # the single-request path: no grouping
            d = str(domains[0])
            for o, p in probabilities.items():
                count, total = self._cell(d, o)
                count.inc()
                total.inc(float(p[0]))
            return
        # a batch holds a few domains: one comparison per domain is cheaper than np.unique, whose
        # sort of the strings was two thirds of recording a batch of 256 (bench_serving --ops)
        objectives = list(probabilities)
        p = np.column_stack([np.asarray(probabilities[o], np.float64) for o in objectives])  # (rows, objectives)
        names = list(known or ())
        rows = np.stack([domains == d for d in names]) if names else np.zeros((0, len(domains)), bool)
        if int(rows.sum()) != len(domains):  # a domain outside `known` (or none given): the batch's own
            names = list(dict.fromkeys(domains.tolist()))
            rows = np.stack([domains == d for d in names])
        counts = rows.sum(axis=1).tolist()
        sums = (rows.astype(np.float64) @ p).tolist()  # (domains, objectives): every cell's sum in one product
        for i, d in enumerate(names):
            if not counts[i]:
                continue  # a cell with no row here gets no series
            for j, o in enumerate(objectives):
                count, total = self._cell(d, o)
                count.inc(counts[i])
                total.inc(sums[i][j])

    def exposition(self) -> tuple[bytes, str]:
        if self.multiprocess:
            from prometheus_client import multiprocess as mp

            registry = CollectorRegistry()
            mp.MultiProcessCollector(registry)
            if self.monitor is not None:
                registry.register(self.monitor)
            return generate_latest(registry), CONTENT_TYPE_LATEST
        return generate_latest(self._registry), CONTENT_TYPE_LATEST

    def close(self) -> None:
        """A worker that stops: its live gauges (in flight, version, lag) leave the sums."""
        if self.multiprocess:
            from prometheus_client import multiprocess as mp

            mp.mark_process_dead(os.getpid())


class MetricsMiddleware:
    """ASGI middleware: latency per route, responses by status and requests in flight. Paths
    outside the app's routes share one label (`other`), so a scan of random URLs cannot grow the
    number of series."""

    def __init__(self, app, metrics: ServingMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        route = path if path in ROUTES else "other"
        status = 500
        m = self.metrics

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        start = time.perf_counter()
        m.in_flight.inc()
        try:
            await self.app(scope, receive, send_status)
        finally:
            m.in_flight.dec()
            m.latency.labels(route).observe(time.perf_counter() - start)
            m.responses.labels(route, str(status)).inc()
