"""The prediction log's writer: requests copy their rows in, a background thread writes them.

A request copies its rows into preallocated columns (`lattice.monitoring.records.LogChunk`;
no Arrow, no disk), under a lock held only for that copy; the thread takes the filled chunks,
builds a table from their buffers and writes a parquet part (`write_partitioned`) every
`flush_seconds` or `flush_records`. Nothing here may block or fail a request: a full buffer, an
unwritable folder or a full disk each drop the records concerned and count them (`dropped`,
by reason), which /healthz and /metrics show. `close()` writes whatever is buffered, so a clean
stop keeps every acknowledged record; a SIGKILL loses at most the records of the last
`flush_seconds`.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from lattice.monitoring.records import LogChunk, LogSchema, write_partitioned

log = logging.getLogger(__name__)

SPARE_CHUNKS = 2  # chunks allocated up front


class PredictionLogWriter:
    def __init__(self, schema: LogSchema, root: Path, queue_records: int = 100_000, flush_seconds: float = 1.0,
                 flush_records: int = 5_000, on_write: Callable[[int, float], None] | None = None,
                 compression: str = "lz4", part_format: str = "arrow"):
        self.schema = schema
        self.compression = compression
        self.part_format = part_format  # arrow: the monitor encodes the parquet (lattice.monitoring.compact)
        self.root = Path(root)
        self.queue_records = queue_records
        self.flush_seconds = flush_seconds
        self.flush_records = flush_records
        self._on_write = on_write  # (records written, oldest record's age in seconds): for /metrics
        # a chunk holds what one flush usually writes; a request larger than the room left spans chunks
        self._chunk_rows = max(1, min(flush_records, queue_records))
        self._filling: list[LogChunk] = []  # chunks with rows not yet taken by the writer; the last one open
        # emptied chunks, all kept for reuse: allocating one (~0.75 ms for 5,000 rows, mostly page
        # faults) is what a request must not pay, and `queue_records` bounds them anyway
        self._spare: list[LogChunk] = [LogChunk(schema, self._chunk_rows) for _ in range(SPARE_CHUNKS)]
        self._pending = 0  # records buffered
        self._cond = threading.Condition()
        self._closing = False
        self._flush_wanted = False  # set by `flush`: seen even when it came while the thread was busy
        self._submitted = 0  # records ever accepted, and those written or dropped since: `flush` waits on them
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
        """Records lost before they reached the buffer (the caller could not build them)."""
        self._drop(reason, n)

    def _drop(self, reason: str, n: int) -> None:
        with self._cond:  # re-entrant (Condition's default RLock): request threads and the writer both count
            self.dropped[reason] = self.dropped.get(reason, 0) + n

    def _open_chunk(self) -> LogChunk:
        if self._filling and self._filling[-1].room:
            return self._filling[-1]
        chunk = self._spare.pop() if self._spare else LogChunk(self.schema, self._chunk_rows)
        self._filling.append(chunk)
        return chunk

    def submit(self, n: int, **columns: Any) -> bool:
        """Copy `n` rows (the keyword arguments of `LogChunk.put`) into the buffer; False when
        any was dropped. Cheap and never raises: the request path calls it."""
        with self._cond:
            if self._closing:
                self._drop("closed", n)
                return False
            if self._pending + n > self.queue_records:
                self._drop("queue_full", n)
                return False
            done = 0
            try:
                while done < n:
                    chunk = self._open_chunk()
                    step = min(n - done, chunk.room)
                    chunk.put(done, done + step, **columns)
                    done += step
            except Exception as exc:  # malformed columns: the rows not copied are counted, the request goes on
                if "record_error" not in self.dropped:
                    log.exception("prediction log: %d record(s) could not be copied", n - done)
                self._drop("record_error", n - done)
                self.last_error = f"{type(exc).__name__}: {exc}"
            self._pending += done
            self._submitted += done
            if self._pending >= self.flush_records:
                self._cond.notify()
        return done == n

    def _take(self) -> list[LogChunk]:
        with self._cond:
            chunks, self._filling = [c for c in self._filling if c.n], []
            self._pending = 0
        return chunks

    def _warm_up(self) -> None:
        """Build and encode an empty part once: the first real write would otherwise pay for
        pyarrow's lazy imports (pandas among them; seconds on a loaded machine), a window in
        which a killed server loses more than `flush_seconds` of records."""
        import io

        import pyarrow.parquet as pq

        try:
            empty = LogChunk(self.schema, 0).table()
            if self.part_format == "arrow":
                with pa.ipc.new_file(io.BytesIO(), empty.schema) as w:
                    w.write_table(empty)
            else:
                pq.write_table(empty, io.BytesIO(), compression=self.compression)
        except Exception:  # noqa: BLE001 - only a warm-up; the real write reports its own errors
            pass

    def _run(self) -> None:
        self._warm_up()
        while True:
            with self._cond:
                if not (self._closing or self._flush_wanted or self._pending >= self.flush_records):
                    self._cond.wait(self.flush_seconds)
                closing, self._flush_wanted = self._closing, False
            chunks = self._take()
            n = sum(c.n for c in chunks)
            try:
                self._flush(chunks, n)
            finally:
                for c in chunks:
                    c.reset()  # its table is written (or dropped) and gone: the memory can be refilled
                with self._cond:
                    self._spare.extend(chunks)
                    self._done += n
                    self._cond.notify_all()
            if closing:
                return

    def _flush(self, chunks: list[LogChunk], n: int) -> None:
        if not n:
            return
        oldest = min(c.first_at for c in chunks)
        try:
            table = pa.concat_tables([c.table() for c in chunks])
        except Exception as exc:  # a bug in building the rows: count it, keep serving
            log.exception("prediction log: %d record(s) could not be built", n)
            self._drop("build_error", n)
            self.last_error = f"{type(exc).__name__}: {exc}"
            return
        try:
            write_partitioned(table, self.root, self.compression, self.part_format)
        except OSError as exc:  # unwritable folder, full disk, a vanished mount
            self._drop("write_error", n)
            if self.last_error is None or not self.last_error.endswith(str(exc)):
                log.warning("prediction log: %d record(s) dropped, cannot write under %s: %s", n, self.root, exc)
            self.last_error = f"{type(exc).__name__}: {exc}"
            return
        finally:
            del table  # the chunks' buffers are free to refill only once nothing references them
        self.written += n
        self.lag_seconds = time.time() - oldest
        self.last_error = None
        if self._on_write is not None:
            self._on_write(n, self.lag_seconds)

    def flush(self, timeout: float = 10.0) -> None:
        """Write what is queued now (tests; a caller that must see its records on disk)."""
        with self._cond:
            target = self._submitted
            self._flush_wanted = True
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
