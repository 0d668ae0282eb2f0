"""The prediction log's one schema, built here for serving and for `lattice predict` alike.

One row per scored example:

    request_id      string   the client's id (batch scoring: the example id)
    logged_at       timestamp[us, UTC]  when it was scored
    origin          string   serve | batch
    domain          string
    model_version   int64    registry version (null: an unregistered model scored it)
    <entity key>    int64    the ids the online store was asked for (as in the example table)
    <pass-through>  string   the source's pass-through keys (an impression id) when sent
    p_<objective>   float64  the probability served
    unknown_entities string  entity keys the online store did not know, comma-separated
    store_error     bool     the online store could not be read (not the same as unknown)
    f.<column>      the feature values the model used: sparse ids (int64), dense values
                    (float64, null where not sent) and online aggregates (float64)

and the hive partition `hour=YYYY-MM-DDTHH` (UTC) it is written under. Feature columns carry a
prefix so that a pass-through name can never collide with one.
"""

from __future__ import annotations

import datetime as dt
import os
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc  # noqa: F401 - pa.ipc
import pyarrow.parquet as pq

from lattice.config import PlatformConfig
from lattice.data import schema as S

FEATURE_PREFIX = "f."
PARTITION = "hour"


def log_dir(workdir: Path) -> Path:
    return Path(workdir) / "prediction_log"


def monitor_summary(workdir: Path) -> Path:
    """The monitor stage's last result (read by the server for its per-cell gauges)."""
    return Path(workdir) / "monitoring" / "summary.json"


def hour_of(epoch_seconds: float) -> str:
    return dt.datetime.fromtimestamp(epoch_seconds, dt.timezone.utc).strftime("%Y-%m-%dT%H")


def feature_column(column: str) -> str:
    return FEATURE_PREFIX + column


class LogSchema:
    """The column layout under one platform config."""

    def __init__(self, config: PlatformConfig, features: bool = True):
        self.objectives = config.objective_names
        self.entity_keys = [f.column for f in config.entity_features]
        self.passthrough = S.passthrough_columns(config)
        self.sparse = [c for c in S.sparse_columns(config) if c not in self.entity_keys] if features else []
        self.dense = (S.dense_columns(config) + S.aggregate_columns(config)) if features else []
        fields = [("request_id", pa.string()), ("logged_at", pa.timestamp("us", tz="UTC")), ("origin", pa.string()),
                  ("domain", pa.string()), ("model_version", pa.int64())]
        fields += [(k, pa.int64()) for k in self.entity_keys]
        fields += [(k, pa.string()) for k in self.passthrough]
        fields += [(f"p_{o}", pa.float64()) for o in self.objectives]
        fields += [("unknown_entities", pa.string()), ("store_error", pa.bool_())]
        fields += [(feature_column(c), pa.int64()) for c in self.sparse]
        fields += [(feature_column(c), pa.float64()) for c in self.dense]
        self.schema = pa.schema(fields)


class LogChunk:
    """Preallocated columns for up to `capacity` log rows, filled request by request.

    Why not keep each request's own columns and merge them at flush time: concatenating
    thousands of one-row arrays held the GIL ~11 ms per 1,000 single requests in the writer's
    thread, and every request that came back from a torch op meanwhile waited for it
    (single-request p99 x1.5, docs/bench/serving.md). Filling fixed arrays costs each request a
    slice assignment per column instead, and `table()` only hands numpy buffers to Arrow.

    `put` writes every column of its rows, absent ones as nulls, so a chunk reused after a
    write keeps nothing of its last rows. `table()` may share the chunk's memory: reuse a chunk
    only once its table has been written and dropped."""

    def __init__(self, schema: LogSchema, capacity: int):
        self.schema = schema
        self.capacity = capacity
        self.n = 0
        self.first_at: float | None = None  # wall time of the first row put (the log's lag)
        zeros = lambda dtype: np.zeros(capacity, dtype)
        self.request_id = np.empty(capacity, object)
        self.logged_at = zeros(np.float64)
        self.origin = np.empty(capacity, object)
        self.domain = np.empty(capacity, object)
        self.model_version = zeros(np.int64)
        self.entities = {k: (zeros(np.int64), zeros(bool)) for k in schema.entity_keys}
        self.passthrough = {k: np.empty(capacity, object) for k in schema.passthrough}
        self.probabilities = {o: zeros(np.float64) for o in schema.objectives}
        self.unknown = np.empty(capacity, object)
        self.store_error = zeros(bool)
        self.sparse = {c: (zeros(np.int64), zeros(bool)) for c in schema.sparse}
        self.dense = {c: (zeros(np.float64), zeros(bool)) for c in schema.dense}

    @property
    def room(self) -> int:
        return self.capacity - self.n

    def reset(self) -> None:
        self.n, self.first_at = 0, None

    def put(self, lo: int, hi: int, *, request_id: list, logged_at: float | np.ndarray, origin: str | np.ndarray, domain,
            model_version: int | None | np.ndarray, entities: dict[str, tuple[np.ndarray, np.ndarray]],
            passthrough: dict[str, list], probabilities: dict[str, np.ndarray], unknown: list[list[str]],
            store_error: bool | np.ndarray, sparse: dict[str, tuple[np.ndarray, np.ndarray]], dense: dict[str, np.ndarray],
            dense_present: dict[str, np.ndarray] | None = None) -> None:
        """Rows lo:hi of one request's columns -> the chunk's next hi - lo rows (at most `room`).

        entities / sparse: column -> (int64 ids, present mask); dense: column -> float64 values,
        null where `dense_present` says the value was not sent (no flags: present wherever given);
        passthrough: column -> values (None: not sent). logged_at, origin, model_version (None or
        -1: none) and store_error: one value for every row, or one per row. Columns the schema
        does not log are ignored; `n` moves only once every column is written."""
        a, b = self.n, self.n + hi - lo
        if b > self.capacity:
            raise ValueError(f"{hi - lo} row(s) do not fit in the {self.room} left")
        # one row (most requests): element assignment, half the cost of a one-row slice's
        d, s = (a, lo) if b - a == 1 else (slice(a, b), slice(lo, hi))
        rows = lambda v: v[s] if isinstance(v, (np.ndarray, list)) else v  # per-row values, or one for all
        self.request_id[d] = request_id[s]
        self.logged_at[d] = rows(logged_at)
        self.origin[d] = rows(origin)
        self.domain[d] = rows(domain)
        self.model_version[d] = -1 if model_version is None else rows(model_version)
        for group, given in ((self.entities, entities), (self.sparse, sparse)):
            for k, (ids, present) in group.items():
                got = given.get(k)
                if got is None:
                    present[d] = False
                else:
                    ids[d] = got[0][s]
                    present[d] = got[1][s]
        for k, values in self.passthrough.items():
            got = passthrough.get(k)
            if got is None:
                values[d] = None
            else:
                got = got[s]
                values[d] = (None if got is None else str(got)) if type(s) is int else [None if v is None else str(v) for v in got]
        for o, values in self.probabilities.items():
            values[d] = probabilities[o][s]
        if type(s) is int:
            self.unknown[d] = ",".join(unknown[s])
        else:  # most batches have no unknown entity: one fill, not a join per row
            got = unknown[s]
            self.unknown[d] = [",".join(u) for u in got] if any(got) else ""
        self.store_error[d] = rows(store_error)
        flags = dense_present or {}
        for c, (values, present) in self.dense.items():
            got = dense.get(c)
            if got is None:
                present[d] = False
            else:
                values[d] = got[s]
                present[d] = flags[c][s] if c in flags else True
        if self.first_at is None:
            self.first_at = time.time()
        self.n = b

    def table(self) -> pa.Table:
        """The rows put so far, in the log's schema."""
        n = self.n
        version = self.model_version[:n]
        cols: dict[str, pa.Array] = {
            "request_id": pa.array(self.request_id[:n], pa.string()),
            "logged_at": pa.array((self.logged_at[:n] * 1e6).astype(np.int64), pa.timestamp("us", tz="UTC")),
            "origin": pa.array(self.origin[:n], pa.string()),
            "domain": pa.array(self.domain[:n], pa.string()),
            "model_version": pa.array(version, pa.int64(), mask=version < 0),
        }
        for k, (ids, present) in self.entities.items():
            cols[k] = pa.array(ids[:n], pa.int64(), mask=~present[:n])
        for k, values in self.passthrough.items():
            cols[k] = pa.array(values[:n], pa.string())
        for o, values in self.probabilities.items():
            cols[f"p_{o}"] = pa.array(values[:n], pa.float64())
        cols["unknown_entities"] = pa.array(self.unknown[:n], pa.string())
        cols["store_error"] = pa.array(self.store_error[:n], pa.bool_())
        for c, (ids, present) in self.sparse.items():
            cols[feature_column(c)] = pa.array(ids[:n], pa.int64(), mask=~present[:n])
        for c, (values, present) in self.dense.items():
            cols[feature_column(c)] = pa.array(values[:n], pa.float64(), mask=~present[:n])
        return pa.table(cols, schema=self.schema.schema)


def record_batch(schema: LogSchema, **columns) -> pa.Table:
    """Columns of n scored rows (`LogChunk.put`'s arguments) -> an Arrow table in the log's schema."""
    n = len(columns["request_id"])
    chunk = LogChunk(schema, n)
    chunk.put(0, n, **columns)
    return chunk.table()


# Columns with few distinct values: parquet's dictionary encoding shrinks them. On the others
# (request ids, entity ids, scores, dense values) it is work that falls back to plain encoding:
# restricted to these, a 5,120-row part of the demo's schema was 15% smaller (546 -> 463 kB,
# zstd) and no slower to write (docs/bench/serving.md).
_FEW_VALUES = ("origin", "domain", "unknown_entities", "model_version")


def _dictionary_columns(table: pa.Table) -> list[str]:
    return [f.name for f in table.schema
            if f.name in _FEW_VALUES or (f.name.startswith(FEATURE_PREFIX) and pa.types.is_integer(f.type))]


PART_SUFFIX = {"parquet": ".parquet", "arrow": ".arrow"}
# Arrow IPC compresses buffers with lz4 or zstd only. Uncompressed was not cheaper: a part 1.5x
# the size cost the kernel more to write than lz4 cost to encode (docs/bench/serving.md)
IPC_CODEC = {"lz4": "lz4", "zstd": "zstd", "snappy": "lz4", "none": None}


def write_partitioned(table: pa.Table, root: Path, compression: str = "lz4", fmt: str = "parquet") -> list[Path]:
    """Append `table` under `root/hour=.../part-<unique>.<parquet|arrow>`, one file per hour it spans.

    `fmt`: `parquet` (encoded with `compression`), or `arrow`: an Arrow IPC file, Arrow's buffers
    as they are, lz4-compressed (`IPC_CODEC`), which the monitor later compacts into parquet
    (`lattice.monitoring.compact`). Each part is written to a hidden temporary name and renamed,
    so a reader (or a crash) never sees half a file: a part is on disk whole or not at all."""
    if table.num_rows == 0:
        return []
    # hours as integers: formatting every row's hour as a string, then sorting the strings, took
    # 0.43 us a row, more than encoding the part (docs/bench/serving.md); only distinct hours are formatted
    hours = table.column("logged_at").to_numpy(zero_copy_only=False).astype("datetime64[h]").astype(np.int64)
    lo, hi = int(hours.min()), int(hours.max())
    spans = [lo] if lo == hi else np.unique(hours).tolist()
    out = []
    for hour in spans:
        part = table.filter(pa.array(hours == hour)) if len(spans) > 1 else table
        folder = Path(root) / f"{PARTITION}={np.datetime_as_string(np.datetime64(hour, 'h'), unit='h')}"
        folder.mkdir(parents=True, exist_ok=True)
        name = f"part-{os.getpid()}-{uuid.uuid4().hex[:12]}{PART_SUFFIX[fmt]}"
        tmp = folder / f".{name}.tmp"
        try:
            if fmt == "arrow":  # built in memory, then one write: Arrow's own file sink makes one call per buffer
                sink = pa.BufferOutputStream()
                # on the writer's own thread: Arrow's pool compresses buffers in parallel on every
                # core, 27% more CPU a row (0.38 against 0.30 us) taken from the serving threads
                options = pa.ipc.IpcWriteOptions(compression=IPC_CODEC[compression], use_threads=False)
                with pa.ipc.new_file(sink, part.schema, options=options) as writer:
                    writer.write_table(part)
                with open(tmp, "wb") as f:
                    f.write(sink.getvalue())
            else:
                pq.write_table(part, tmp, compression=compression, use_dictionary=_dictionary_columns(part))
            os.replace(tmp, folder / name)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a full disk must not leave half a part behind to fill it further
            raise
        out.append(folder / name)
    return out


def _ids(series) -> tuple[np.ndarray, np.ndarray]:
    import pandas as pd

    values = pd.to_numeric(series, errors="coerce")
    present = values.notna().to_numpy()
    return values.fillna(0).astype(np.int64).to_numpy(), present


def frame_batch(schema: LogSchema, frame, probabilities: dict[str, np.ndarray], unknown: list[list[str]],
                model_version: int | None, origin: str = "batch", logged_at: float | None = None) -> pa.Table:
    """Rows in the consolidated layout (`lattice predict`'s parsed input, aggregates attached)
    -> the log's table; the example id is the request id, as serving's clients send it."""

    n = len(frame)
    entities = {k: _ids(frame[k]) if k in frame else (np.zeros(n, np.int64), np.zeros(n, bool)) for k in schema.entity_keys}
    sparse = {c: _ids(frame[c]) for c in schema.sparse if c in frame}
    dense, present = {}, {}
    for c in schema.dense:
        if c in frame:
            v = frame[c].astype("float64").to_numpy()
            dense[c] = np.nan_to_num(v)
            flag = S.present_column(c)
            present[c] = frame[flag].to_numpy().astype(bool) if flag in frame else ~np.isnan(v)
    return record_batch(
        schema, request_id=frame["example_id"].astype(str).tolist(), logged_at=time.time() if logged_at is None else logged_at,
        origin=origin, domain=frame["domain"].astype(str).to_numpy(), model_version=model_version, entities=entities,
        passthrough={k: frame[k].where(frame[k].notna(), None).tolist() for k in schema.passthrough if k in frame},
        probabilities=probabilities, unknown=unknown, store_error=False, sparse=sparse, dense=dense, dense_present=present)
