"""The prediction log joined with the labels that have arrived.

A logged prediction finds its example by the identity the feature stage gives it: the source's
pass-through keys (an impression id) when the request carried them all, else its request id as
the example id (what serving's clients send: `lattice.serving.client`). An example's label for
an objective counts only where its mask is 1: a label still inside its attribution window (or a
domain that never carries it) is masked, and a masked label is not a negative. A prediction
whose example has not arrived yet is `pending`, never a negative either.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as ds

from lattice.config import PlatformConfig
from lattice.data import schema as S
from lattice.monitoring.compact import log_dataset
from lattice.monitoring.records import log_dir

_SEP = "\x1f"  # joins several pass-through values into one key (a character no id holds)


def _dataset(path: Path) -> ds.Dataset | None:
    if not path.exists() or not any(path.rglob("*.parquet")):
        return None
    return ds.dataset(str(path), format="parquet", partitioning="hive", exclude_invalid_files=True)


def utc(t) -> pd.Timestamp:
    ts = pd.Timestamp(t)
    return ts.tz_localize("UTC") if ts.tz is None else ts.tz_convert("UTC")


def read_log(workdir: Path, start: dt.datetime | None = None, end: dt.datetime | None = None) -> pd.DataFrame:
    """Log rows with `logged_at` in [start, end) (UTC; a naive time is read as UTC), every column."""
    flt = None
    if start is not None:
        flt = ds.field("logged_at") >= utc(start)
    if end is not None:
        upper = ds.field("logged_at") < utc(end)
        flt = upper if flt is None else flt & upper
    for attempt in range(3):
        try:
            data = log_dataset(log_dir(workdir))
            return pd.DataFrame() if data is None else data.to_table(filter=flt).to_pandas()
        except FileNotFoundError:  # a part compacted away (another monitor) after it was listed: list again
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _key(frame: pd.DataFrame, passthrough: list[str], id_column: str) -> pd.Series:
    """Each row's join key: its pass-through values when it has all of them, else its id."""
    key = "id:" + frame[id_column].astype("string")
    if passthrough and all(c in frame for c in passthrough):
        have = frame[passthrough].notna().all(axis=1)
        pt = "pt:" + frame[passthrough].astype("string").fillna("").agg(_SEP.join, axis=1)
        key = key.where(~have, pt)
    return key


def read_labels(config: PlatformConfig, consolidated: Path, request_ids: list[str] | None = None) -> pd.DataFrame:
    """Example identity, domain and label + mask per objective from the consolidated table.
    `request_ids`: read only these examples (possible when no source has pass-through keys,
    which would join other rows)."""
    data = _dataset(consolidated)
    if data is None:
        return pd.DataFrame()
    objs = config.objective_names
    passthrough = S.passthrough_columns(config)
    from lattice.data.label_time import columns_needed

    want = (["example_id", "domain", *passthrough] + [S.label_column(o) for o in objs] + [S.mask_column(o) for o in objs]
            + columns_needed(config))
    cols = [c for c in want if c in data.schema.names]
    flt = ds.field("example_id").isin(request_ids) if request_ids is not None and not passthrough else None
    return data.to_table(columns=cols, filter=flt).to_pandas()


def labels_known_at(config: PlatformConfig, labels: pd.DataFrame, as_of) -> pd.DataFrame:
    """The labels as known at `as_of` (the monitor's end, or now): the consolidated table keeps each
    label as it finally is, so an impression whose attribution window is still open at `as_of` is
    masked (not a negative, and not a positive either: `training.label_delay: mask`'s rule)."""
    from lattice.data.label_time import delayed_objectives, mask_at_cutoff

    if labels.empty or not delayed_objectives(config) or "event_timestamp" not in labels:
        return labels
    return mask_at_cutoff(labels, utc(as_of).to_pydatetime(), config, mode="mask")


def join_labels(config: PlatformConfig, log: pd.DataFrame, labels: pd.DataFrame) -> pd.DataFrame:
    """The log with `label_<o>` and `mask_<o>` per objective (0 where no example arrived) and
    `joined` (whether its example was found)."""
    out = log.copy()
    objs = config.objective_names
    passthrough = S.passthrough_columns(config)
    if out.empty:
        return out
    out["__key"] = _key(out, passthrough, "request_id")
    if labels.empty:
        side = pd.DataFrame(columns=["__key"])
    else:
        ids = labels.assign(__key="id:" + labels["example_id"].astype("string"))
        frames = [ids]
        if passthrough and all(c in labels for c in passthrough):
            keyed = labels[labels[passthrough].notna().all(axis=1)]
            frames.append(keyed.assign(__key=_key(keyed, passthrough, "example_id")))
        side = pd.concat(frames, ignore_index=True).drop_duplicates("__key")
    keep = ["__key"] + [c for o in objs for c in (S.label_column(o), S.mask_column(o)) if c in side]
    merged = out.merge(side[keep].assign(__found=True), on="__key", how="left")
    merged["joined"] = merged.pop("__found").eq(True)
    for o in objs:
        lab, mask = S.label_column(o), S.mask_column(o)
        m = merged[mask] if mask in merged else pd.Series(np.where(merged["joined"], 1, 0), index=merged.index)
        merged[mask] = (pd.to_numeric(m, errors="coerce").fillna(0).astype(np.int8) * merged["joined"]).astype(np.int8)
        merged[lab] = pd.to_numeric(merged[lab], errors="coerce").fillna(0).astype(np.float64) if lab in merged else 0.0
    return merged.drop(columns="__key")
