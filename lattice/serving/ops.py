"""What serving records about what it serves: the prediction log and the Prometheus metrics,
fed from one call per scored batch (`record`), and their state for /healthz.

Recording must never fail a request that was scored: any error here is counted as a dropped
log record and logged once per kind, and the response goes out as computed."""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path

import numpy as np

from lattice.config import PlatformConfig
from lattice.data import schema as S
from lattice.monitoring.records import LogSchema, log_dir, monitor_summary
from lattice.serving.metrics import ServingMetrics
from lattice.serving.prediction_log import PredictionLogWriter

log = logging.getLogger(__name__)


class ServingOps:
    def __init__(self, config: PlatformConfig, workdir: Path | None):
        settings = config.monitoring.prediction_log
        summary = monitor_summary(workdir) if workdir is not None else None
        self.metrics = ServingMetrics(summary) if config.monitoring.metrics else None
        self.writer: PredictionLogWriter | None = None
        if settings.enabled and workdir is not None:
            schema = LogSchema(config, features=settings.features)
            self.writer = PredictionLogWriter(schema, log_dir(workdir), queue_records=settings.queue_records,
                                              flush_seconds=settings.flush_seconds, flush_records=settings.flush_records,
                                              on_write=self._written, compression=settings.compression,
                                              part_format=settings.part_format)
        self._passthrough = S.passthrough_columns(config)
        self._entity_keys = [f.column for f in config.entity_features]
        self._dense = S.dense_columns(config)
        self._domains = config.domain_names
        self._reported: dict[str, int] = {}  # drops already added to the Prometheus counter, by reason
        self._failed_once: set[str] = set()
        self._version: int | None = None

    def _written(self, n: int, lag: float) -> None:
        if self.metrics is None:
            return
        self.metrics.log_written.inc(n)
        self.metrics.log_lag.set(lag)
        self._sync_drops()

    def _sync_drops(self) -> None:
        if self.writer is None or self.metrics is None:
            return
        for reason, n in list(self.writer.dropped.items()):
            seen = self._reported.get(reason, 0)
            if n > seen:
                self.metrics.log_dropped.labels(reason).inc(n - seen)
                self._reported[reason] = n

    def model_version(self, version: int | None) -> None:
        if version is not None and version != self._version and self.metrics is not None:
            self.metrics.model_version.set(version)
            self._version = version

    def record(self, reqs: list, cols, probs: dict[str, np.ndarray], unknown: list[list[str]], store_errors: int,
               store_reads: int, version: int, logged_at: float | None = None) -> None:
        """One scored batch: metrics now, the log rows handed to the writer's thread. `logged_at`:
        the time the log records (epoch seconds; default now), given only by a replay of past
        traffic (`lattice serve --replay-clock`)."""
        if self.metrics is not None:
            self._count(cols, probs, unknown, store_errors, store_reads, version)
        if self.writer is None:
            return
        try:
            dense_present = {c: cols.dense[S.present_column(c)] for c in self._dense if S.present_column(c) in cols.dense}
            ok = self.writer.submit(
                len(reqs), request_id=[r.request_id for r in reqs], logged_at=time.time() if logged_at is None else logged_at,
                origin="serve",
                domain=cols.domain, model_version=version,
                entities={k: cols.sparse[k] for k in self._entity_keys},
                passthrough={k: [(r.passthrough or {}).get(k) for r in reqs] for k in self._passthrough},
                probabilities=probs, unknown=unknown, store_error=store_errors > 0,
                sparse=cols.sparse, dense=cols.dense, dense_present=dense_present)
            if not ok:
                self._sync_drops()
        except Exception as exc:
            self.writer.count_dropped("record_error", len(reqs))
            self._sync_drops()
            self._once("log", exc)

    def _count(self, cols, probs, unknown, store_errors: int, store_reads: int, version: int) -> None:
        try:
            m = self.metrics
            self.model_version(version)
            m.observe_predictions(cols.domain, probs, self._domains)
            if store_errors:
                m.store_errors.inc(store_errors)
            elif any(unknown):  # with the store unreadable, "unknown" says nothing about the entity
                # one inc per key, not per row: a labelled inc costs ~3 us, so a batch of 256 with
                # 30% unknown users paid 107 us here, against 11 us counted first
                for key, n in Counter(k for u in unknown for k in u).items():
                    m.unknown.labels(key).inc(n)
            if store_reads:
                m.store_reads.inc(store_reads)
        except Exception as exc:  # a metrics bug must not fail a scored request
            self._once("metrics", exc)

    def _once(self, what: str, exc: Exception) -> None:
        if what not in self._failed_once:
            self._failed_once.add(what)
            log.exception("recording a scored batch (%s) failed; requests are still answered", what, exc_info=exc)

    def health(self) -> tuple[dict | None, list[str]]:
        """The log's state for /healthz, and warnings (drops) that make the status `degraded`."""
        if self.writer is None:
            return None, []
        self._sync_drops()
        state = self.writer.health()
        warnings = []
        if self.writer.dropped_total:
            warnings.append(f"prediction log: {self.writer.dropped_total} record(s) dropped {state['dropped']}"
                            + (f"; last error: {state['last_error']}" if state["last_error"] else ""))
        return state, warnings

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self._sync_drops()
        if self.metrics is not None:
            self.metrics.close()
