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
import uuid
from operator import itemgetter
from pathlib import Path

import numpy as np
import pyarrow as pa
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


def _per_row(value, n: int, dtype=object) -> np.ndarray:
    return np.asarray(value, dtype) if isinstance(value, (np.ndarray, list)) else np.full(n, value, dtype)


def record_batch(schema: LogSchema, *, request_id: list, logged_at: float | np.ndarray, origin: str | np.ndarray, domain,
                 model_version: int | None | np.ndarray, entities: dict[str, tuple[np.ndarray, np.ndarray]],
                 passthrough: dict[str, list], probabilities: dict[str, np.ndarray], unknown: list[list[str]],
                 store_error: bool | np.ndarray, sparse: dict[str, tuple[np.ndarray, np.ndarray]], dense: dict[str, np.ndarray],
                 dense_present: dict[str, np.ndarray] | None = None) -> pa.Table:
    """Columns of n scored rows -> an Arrow table in the log's schema.

    entities / sparse: column -> (int64 ids, present mask); dense: column -> float64 values, null
    where `dense_present` says the value was not sent; passthrough: column -> values (None: not sent).
    logged_at, origin, model_version and store_error: one value for every row, or one per row
    (model_version -1 per row: none)."""
    n = len(request_id)
    ts = (_per_row(logged_at, n, np.float64) * 1e6).astype(np.int64)
    version = _per_row(-1 if model_version is None else model_version, n, np.int64)
    cols: dict[str, pa.Array] = {
        "request_id": pa.array(request_id, pa.string()),
        "logged_at": pa.array(ts, pa.timestamp("us", tz="UTC")),
        "origin": pa.array(_per_row(origin, n), pa.string()),
        "domain": pa.array(np.asarray(domain, dtype=object), pa.string()),
        "model_version": pa.array(version, pa.int64(), mask=version < 0),
    }
    missing = np.zeros(n, bool)
    for k in schema.entity_keys:
        ids, present = entities[k]
        cols[k] = pa.array(ids, pa.int64(), mask=~np.asarray(present, bool))
    for k in schema.passthrough:
        vals = passthrough.get(k)
        cols[k] = pa.array([None if v is None else str(v) for v in vals] if vals is not None else [None] * n, pa.string())
    for o in schema.objectives:
        cols[f"p_{o}"] = pa.array(np.asarray(probabilities[o], np.float64), pa.float64())
    cols["unknown_entities"] = pa.array([",".join(u) for u in unknown], pa.string())
    cols["store_error"] = pa.array(_per_row(store_error, n, bool), pa.bool_())
    for c in schema.sparse:
        if c in sparse:
            ids, present = sparse[c]
            cols[feature_column(c)] = pa.array(ids, pa.int64(), mask=~np.asarray(present, bool))
        else:
            cols[feature_column(c)] = pa.nulls(n, pa.int64())
    present_of = dense_present or {}
    for c in schema.dense:
        if c in dense:
            mask = ~np.asarray(present_of[c], bool) if c in present_of else missing
            cols[feature_column(c)] = pa.array(np.asarray(dense[c], np.float64), pa.float64(), mask=mask)
        else:
            cols[feature_column(c)] = pa.nulls(n, pa.float64())
    return pa.table(cols, schema=schema.schema)


_IDS, _PRESENT = itemgetter(0), itemgetter(1)


def _transpose(groups: list[dict], names: list[str]) -> list | None:
    """Per name, its value in every dict of `groups` (one pass of itemgetter and zip, in C), or
    None when some dict lacks a name (the caller then goes key by key)."""
    if not names:
        return []
    try:
        rows = list(map(itemgetter(*names), groups))
    except KeyError:
        return None
    return [rows] if len(names) == 1 else list(zip(*rows))


def merge_columns(items: list[dict], schema: LogSchema | None = None, pause=None) -> dict:
    """Many `record_batch` argument sets (one per scored request) -> one, so that a flush builds
    one Arrow table (a few dozen array conversions) instead of one per request: for single
    requests that is most of the log's cost. Runs in the writer's thread, holding the GIL in its
    Python parts: one concatenation per column. When every request carries the same columns (the
    usual case) they are gathered by `_transpose`, in C; key by key in Python otherwise, which
    held the GIL ~19 ms for 1,000 single requests and moved single-request p99 by ~0.7 ms
    (bench/bench_serving.py --ops --ops-modes on,off,metrics,log). `pause()` runs between columns: the writer passes `time.sleep(0)`, which hands the GIL to a
    waiting request at once instead of after the interpreter's 5 ms switch interval."""
    pause = pause or (lambda: None)
    if len(items) == 1:
        return items[0]
    ns = np.array([len(c["request_id"]) for c in items])

    def scalar_or_rows(name: str, dtype, fill) -> np.ndarray:
        vals = [c[name] for c in items]
        if all(np.isscalar(v) or v is None for v in vals):  # the usual case: one value per request
            return np.repeat(np.array([fill if v is None else v for v in vals], dtype), ns)
        return np.concatenate([_per_row(fill if v is None else v, n, dtype) for v, n in zip(vals, ns)])

    def column(group: str, k: str, part: int | None, make) -> np.ndarray:
        pause()
        got = [c[group].get(k) for c in items]
        return np.concatenate([make(n) if g is None else (g if part is None else g[part]) for g, n in zip(got, ns)])

    def pairs(group: str, wanted: list[str] | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        groups = list(map(itemgetter(group), items))
        same = wanted is not None or len(set(map(len, groups))) == 1
        cols = _transpose(groups, list(wanted if wanted is not None else groups[0])) if same else None
        if cols is not None:
            out = {}
            for k, vals in zip(wanted if wanted is not None else groups[0], cols):
                pause()
                out[k] = (np.concatenate(list(map(_IDS, vals))), np.concatenate(list(map(_PRESENT, vals))))
            return out
        names = wanted if wanted is not None else dict.fromkeys(k for c in items for k in c[group])
        return {k: (column(group, k, 0, lambda n: np.zeros(n, np.int64)), column(group, k, 1, lambda n: np.zeros(n, bool)))
                for k in names}

    # only the columns the log keeps (a request's dense dict also holds presence flags)
    dense_names = schema.dense if schema is not None else list(dict.fromkeys(k for c in items for k in c["dense"]))
    sparse_names = schema.sparse if schema is not None else None
    for c in items:
        c.setdefault("dense_present", {})
    dense_cols = _transpose(list(map(itemgetter("dense"), items)), list(dense_names))
    present = {}
    if dense_cols is not None:  # every request sent every dense column
        dense = {}
        for k, vals in zip(dense_names, dense_cols):
            pause()
            dense[k] = np.concatenate(vals)
        # every request flags the same columns (raw dense ones; aggregates have none): those get
        # their masks, the others are present wherever given, i.e. everywhere (no mask)
        flag_groups = list(map(itemgetter("dense_present"), items))
        flagged = list(flag_groups[0])
        flag_cols = _transpose(flag_groups, flagged) if len(set(map(len, flag_groups))) == 1 else None
        if flag_cols is not None:
            present = {k: np.concatenate([np.asarray(f, bool) for f in flags]) for k, flags in zip(flagged, flag_cols) if k in dense}
        else:
            dense_cols = None  # requests flag different columns: key by key below
    if dense_cols is None:
        dense = {k: column("dense", k, None, np.zeros) for k in dense_names if any(k in c["dense"] for c in items)}
    for k in dense if dense_cols is None else ():
        flags = [c["dense_present"].get(k) for c in items]
        if all(f is None for f in flags) and all(k in c["dense"] for c in items):
            continue  # present wherever it is given: no mask (aggregates)
        present[k] = np.concatenate([np.full(n, k in c["dense"]) if f is None else np.asarray(f, bool)
                                     for f, c, n in zip(flags, items, ns)])
    pt_names = dict.fromkeys(k for c in items for k in c["passthrough"])
    return {
        "request_id": [r for c in items for r in c["request_id"]],
        "logged_at": scalar_or_rows("logged_at", np.float64, 0.0),
        "origin": scalar_or_rows("origin", object, None),
        "domain": np.concatenate([np.asarray(c["domain"], object) for c in items]),
        "model_version": scalar_or_rows("model_version", np.int64, -1),
        "entities": pairs("entities"),
        "passthrough": {k: [v for c, n in zip(items, ns) for v in (c["passthrough"].get(k) or [None] * n)] for k in pt_names},
        "probabilities": {o: np.concatenate([c["probabilities"][o] for c in items]).astype(np.float64, copy=False)
                          for o in items[0]["probabilities"]},
        "unknown": [u for c in items for u in c["unknown"]],
        "store_error": scalar_or_rows("store_error", bool, False),
        "sparse": pairs("sparse", sparse_names),
        "dense": dense, "dense_present": present,
    }


def write_partitioned(table: pa.Table, root: Path) -> list[Path]:
    """Append `table` under `root/hour=.../part-<unique>.parquet`, one file per hour it spans.

    Each part is written to a hidden temporary name and renamed, so a reader (or a crash) never
    sees half a file: a part is on disk whole or not at all."""
    if table.num_rows == 0:
        return []
    ts = table.column("logged_at").to_numpy(zero_copy_only=False).astype("datetime64[h]")
    hours = np.datetime_as_string(ts, unit="h")
    out = []
    for hour in np.unique(hours):
        part = table.filter(pa.array(hours == hour)) if len(np.unique(hours)) > 1 else table
        folder = Path(root) / f"{PARTITION}={hour}"
        folder.mkdir(parents=True, exist_ok=True)
        name = f"part-{os.getpid()}-{uuid.uuid4().hex[:12]}.parquet"
        tmp = folder / f".{name}.tmp"
        try:
            pq.write_table(part, tmp, compression="zstd")
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
    import time

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
