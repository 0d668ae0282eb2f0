"""The prediction log's writer: requests hand their rows over, a background thread writes them.

A request only appends a reference to its columns to a bounded in-memory queue (no Arrow, no
disk, no lock held while writing); the thread builds the table and writes a parquet part
(`lattice.monitoring.records.write_partitioned`) every `flush_seconds` or `flush_records`.
Nothing here may block or fail a request: a full queue, an unwritable folder or a full disk each
drop the records concerned and count them (`dropped`, by reason), which /healthz and /metrics
show. `close()` writes whatever is queued, so a clean stop keeps every acknowledged record; a
SIGKILL loses at most the records of the last `flush_seconds`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

from lattice.monitoring.records import LogSchema, merge_columns, record_batch, write_partitioned

log = logging.getLogger(__name__)


def _yield_gil() -> None:
    time.sleep(0)


class PredictionLogWriter:
    def __init__(self, schema: LogSchema, root: Path, queue_records: int = 100_000, flush_seconds: float = 1.0,
                 flush_records: int = 5_000, on_write: Callable[[int, float], None] | None = None):
        self.schema = schema
        self.root = Path(root)
        self.queue_records = queue_records
        self.flush_seconds = flush_seconds
        self.flush_records = flush_records
        self._on_write = on_write  # (records written, oldest record's age in seconds): for /metrics
        self._queue: deque[tuple[float, dict[str, Any]]] = deque()
        self._pending = 0  # records in the queue (a batch request is one item of many records)
        self._cond = threading.Condition()
        self._closing = False
        self._submitted = 0  # queue items ever accepted, and those written or dropped: `flush` waits on them
        self._done = 0
        self.written = 0
        self.dropped: dict[str, int] = {}  # reason -> records
        self.last_error: str | None = None
        self.lag_seconds = 0.0  # age of the oldest record in the last write, when it was written
        self._thread = threading.Thread(target=self._run, name="prediction-log", daemon=True)
        self._thread.start()

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    def count_dropped(self, reason: str, n: int) -> None:
        """Records lost before they reached the queue (the caller could not build them)."""
        self._drop(reason, n)

    def _drop(self, reason: str, n: int) -> None:
        with self._cond:  # re-entrant (Condition's default RLock): request threads and the writer both count
            self.dropped[reason] = self.dropped.get(reason, 0) + n

    def submit(self, n: int, **columns: Any) -> bool:
        """Queue `n` rows (the keyword arguments of `record_batch`); False when dropped. Cheap
        and never raises: the request path calls it."""
        with self._cond:
            if self._closing:
                self._drop("closed", n)
                return False
            if self._pending + n > self.queue_records:
                self._drop("queue_full", n)
                return False
            self._queue.append((time.time(), columns))
            self._pending += n
            self._submitted += 1
            if self._pending >= self.flush_records:
                self._cond.notify()
        return True

    def _take(self) -> list[tuple[float, dict[str, Any]]]:
        with self._cond:
            items = list(self._queue)
            self._queue.clear()
            self._pending = 0
        return items

    def _warm_up(self) -> None:
        """Build and encode an empty part once: the first real write would otherwise pay for
        pyarrow's lazy imports (pandas among them; seconds on a loaded machine), a window in
        which a killed server loses more than `flush_seconds` of records."""
        import io

        import pyarrow.parquet as pq

        try:
            pq.write_table(self.schema.schema.empty_table(), io.BytesIO())
        except Exception:  # noqa: BLE001 - only a warm-up; the real write reports its own errors
            pass

    def _run(self) -> None:
        self._warm_up()
        while True:
            with self._cond:
                if not self._closing and self._pending < self.flush_records:
                    self._cond.wait(self.flush_seconds)
                closing = self._closing
            items = self._take()
            try:
                self._flush(items)
            finally:
                with self._cond:
                    self._done += len(items)
                    self._cond.notify_all()
            if closing:
                return

    def _flush(self, items: list[tuple[float, dict[str, Any]]]) -> None:
        if not items:
            return
        n = sum(len(c["request_id"]) for _, c in items)
        try:
            table = record_batch(self.schema, **merge_columns([c for _, c in items], self.schema, pause=_yield_gil))
        except Exception as exc:  # a bug in building the rows: count it, keep serving
            log.exception("prediction log: %d record(s) could not be built", n)
            self._drop("build_error", n)
            self.last_error = f"{type(exc).__name__}: {exc}"
            return
        try:
            write_partitioned(table, self.root)
        except OSError as exc:  # unwritable folder, full disk, a vanished mount
            self._drop("write_error", n)
            if self.last_error is None or not self.last_error.endswith(str(exc)):
                log.warning("prediction log: %d record(s) dropped, cannot write under %s: %s", n, self.root, exc)
            self.last_error = f"{type(exc).__name__}: {exc}"
            return
        self.written += n
        self.lag_seconds = time.time() - items[0][0]
        self.last_error = None
        if self._on_write is not None:
            self._on_write(n, self.lag_seconds)

    def flush(self, timeout: float = 10.0) -> None:
        """Write what is queued now (tests; a caller that must see its records on disk)."""
        with self._cond:
            target = self._submitted
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._done >= target or not self._thread.is_alive(), timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Write everything acknowledged, then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("prediction log: the writer did not finish within %.0fs; %d record(s) may be lost", timeout, self._pending)

    def health(self) -> dict:
        return {"path": str(self.root), "written": self.written, "dropped": dict(self.dropped),
                "queued": self._pending, "lag_seconds": round(self.lag_seconds, 3), "last_error": self.last_error}
