"""Labels as they were known at a training cutoff.

The consolidated table keeps each label as it finally is (a positive counts only inside its
objective's attribution window) and, for objectives whose source logs the positive's own time,
`known_<objective>`. One table then serves every cutoff T: this module derives the labels and
masks a model trained at T may see, so no cutoff is baked into the stored rows.

For an objective with attribution window W, an impression at time t:
  - its window closes at t + W; at T it is closed when t + W <= T;
  - `mask` (the default): while the window is open the impression is left out of that
    objective's loss (mask 0), whether or not a positive was already seen: keeping the positives
    that arrive early while dropping their not-yet-converted neighbours would bias the rate up
    (bench/bench_delayed_labels.py measures it); once closed, its final label counts;
  - `naive` (to measure against only): every impression keeps its mask; a positive counts once
    it is known (`known_<objective>` <= T, or t + W <= T when the source logs no time), anything
    else is a negative, which biases the rate down.
  - `zipper`: the objective's own label and mask follow `mask` (validation and the served head
    are judged on closed windows); the Zipper heads' labels come from lattice.data.zipper.
Objectives without a window are known at the impression and pass through unchanged.

A warm start under `mask` trains each label once, when it becomes known: the days its parent
trained on while their windows were open come back as `matured` days (`matured_days`), whose rows
train only on the labels that closed since the parent's cutoff (`train_newly_known`). Without
that, a daily warm start sees a delayed objective's labels only through replay, and its heads
starve (bench/bench_market_life.py, docs/bench/market-life.md).
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from lattice.config import PlatformConfig
from lattice.config.timing import attribution_window
from lattice.data import schema as S

MODES = ("mask", "naive")


def main_mode(mode: str) -> str:
    """The rule for an objective's own label and mask: Zipper judges its served head as `mask` does."""
    return "mask" if mode == "zipper" else mode


def _to_us(values) -> np.ndarray:
    """Timestamps (pandas, numpy or Arrow, tz-aware or naive UTC) -> int64 microseconds, NaT -> min."""
    ts = pd.to_datetime(pd.Series(values), utc=True)
    out = ts.dt.tz_convert(None).to_numpy(dtype="datetime64[us]").astype(np.int64)
    out[ts.isna().to_numpy()] = np.iinfo(np.int64).min
    return out


def _cutoff_us(cutoff: dt.datetime) -> int:
    return int(np.datetime64(_naive(cutoff), "us").astype(np.int64))


def labels_at_cutoff(label: np.ndarray, mask: np.ndarray, event_us: np.ndarray, known_us: np.ndarray | None,
                     cutoff_us: int, window: dt.timedelta, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """The core rule on arrays (times in int64 microseconds; a missing known time is int64 min)."""
    if mode not in MODES:
        raise ValueError(f"label_delay {mode!r} is not one of {list(MODES)}")
    closes = event_us + int(window / dt.timedelta(microseconds=1))
    closed = closes <= cutoff_us
    positive = label > 0
    if mode == "mask":
        return np.where(closed, label, 0).astype(label.dtype), np.where(closed, mask, 0).astype(mask.dtype)
    missing = np.iinfo(np.int64).min
    arrived = closes if known_us is None else np.where(known_us == missing, closes, known_us)
    seen = positive & (arrived <= cutoff_us)
    return seen.astype(label.dtype), mask.copy()


def mask_at_cutoff(df: pd.DataFrame, cutoff: dt.datetime | None, config: PlatformConfig,
                   mode: str | None = None) -> pd.DataFrame:
    """Consolidated rows -> the same rows with `label_<o>` / `mask_<o>` as known at `cutoff`
    (None: the final labels, unchanged). `mode` defaults to `training.label_delay`. Pure: `df` is
    not modified."""
    if cutoff is None:
        return df
    mode = main_mode(mode or config.training.label_delay)
    out = df.copy()
    event = _to_us(df["event_timestamp"])
    for o in config.objective_names:
        window = attribution_window(config, o)
        if window is None:
            continue
        known = _to_us(df[S.known_column(o)]) if S.known_column(o) in df else None
        lab, msk = labels_at_cutoff(df[S.label_column(o)].to_numpy(), df[S.mask_column(o)].to_numpy(), event, known,
                                    _cutoff_us(cutoff), window, mode)
        out[S.label_column(o)], out[S.mask_column(o)] = lab, msk
    return out


def never_known_in_window(config: PlatformConfig, train_days: list[str], cutoff: dt.datetime | None) -> list[str]:
    """Objectives that no train day's impression can be labelled for at `cutoff` under
    `label_delay: mask`: every train day is younger than the attribution window, so every label is
    masked and the objective's heads train on none (a window shorter than the attribution window
    plus a day, or a warm start on the newest days only without replay)."""
    if cutoff is None or not train_days or config.training.label_delay != "mask":
        return []
    oldest = dt.datetime.combine(min(dt.date.fromisoformat(d) for d in train_days), dt.time(), tzinfo=dt.timezone.utc)
    c = cutoff if cutoff.tzinfo else cutoff.replace(tzinfo=dt.timezone.utc)
    return [o for o in delayed_objectives(config) if oldest + attribution_window(config, o) > c]


def delayed_objectives(config: PlatformConfig) -> list[str]:
    """Objectives a cutoff changes (those with an attribution window)."""
    return [o for o in config.objective_names if attribution_window(config, o) is not None]


def columns_needed(config: PlatformConfig) -> list[str]:
    """Columns a reader must load to apply a cutoff."""
    return ["event_timestamp"] + [S.known_column(o) for o in delayed_objectives(config)]


def apply_cutoff_arrow(tbl: pa.Table, cutoff: dt.datetime, config: PlatformConfig, mode: str | None = None) -> pa.Table:
    """`mask_at_cutoff` on an Arrow table (the loader's row groups), label and mask columns replaced."""
    mode = main_mode(mode or config.training.label_delay)
    objs = delayed_objectives(config)
    if not objs:
        return tbl
    if "event_timestamp" not in tbl.column_names:
        raise ValueError("a label cutoff needs the table's event_timestamp column; rebuild the table with `lattice features`")
    event = _to_us(tbl.column("event_timestamp").to_pandas())
    for o in objs:
        lc, mc, kc = S.label_column(o), S.mask_column(o), S.known_column(o)
        if lc not in tbl.column_names or mc not in tbl.column_names:
            continue
        known = _to_us(tbl.column(kc).to_pandas()) if kc in tbl.column_names else None
        lab_arr, msk_arr = tbl.column(lc), tbl.column(mc)
        lab = pc.fill_null(lab_arr, 0).to_numpy()
        msk = pc.fill_null(msk_arr, 0).to_numpy()
        lab, msk = labels_at_cutoff(lab, msk, event, known, _cutoff_us(cutoff), attribution_window(config, o), mode)
        tbl = tbl.set_column(tbl.column_names.index(lc), lc, pa.array(lab, type=lab_arr.type))
        tbl = tbl.set_column(tbl.column_names.index(mc), mc, pa.array(msk, type=msk_arr.type))
    return tbl


def matured_days(config: PlatformConfig, trained_before: list[str], parent_cutoff: dt.datetime | None,
                 cutoff: dt.datetime | None) -> list[str]:
    """Days of `trained_before` (train days the parent already trained on) whose impressions had
    a delayed objective's window still open at the parent's cutoff and have one closed at this
    run's `cutoff`: under `label_delay: mask` the parent never saw those labels; under `zipper`
    the windows are the heads' too (a day matures once per head window, W1 first)."""
    mode = config.training.label_delay
    if parent_cutoff is None or cutoff is None or mode not in ("mask", "zipper"):
        return []
    windows = [attribution_window(config, o) for o in delayed_objectives(config)]
    if mode == "zipper" and config.training.zipper is not None and windows:
        windows += config.training.zipper.spans()
    one = dt.timedelta(days=1)
    out = []
    for d in sorted(trained_before):
        start = dt.datetime.combine(dt.date.fromisoformat(d), dt.time())
        # the day's impressions [start, start + 1d) close in [start + W, start + 1d + W)
        if any(start + w < _naive(cutoff) and start + one + w > _naive(parent_cutoff) for w in windows):
            out.append(d)
    return out


def teaches(tbl: pa.Table, config: PlatformConfig, heads: dict[str, tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Rows with at least one label to train on: an objective's mask, or for an objective trained
    through Zipper heads (`heads`, lattice.data.zipper) any of its heads' masks (its own mask then
    only weighs the teacher's soft label)."""
    out = np.zeros(tbl.num_rows, bool)
    for o in config.objective_names:
        if o in heads:
            out |= heads[o][1].any(axis=1)
        elif S.mask_column(o) in tbl.column_names:
            out |= pc.fill_null(tbl.column(S.mask_column(o)), 0).to_numpy() > 0
    return out


def _naive(t: dt.datetime) -> dt.datetime:
    """A time as naive UTC (the tables' timestamps are naive UTC)."""
    return t.astimezone(dt.timezone.utc).replace(tzinfo=None) if t.tzinfo else t


def train_newly_known(tbl: pa.Table, rows: np.ndarray, parent_cutoff: dt.datetime, config: PlatformConfig,
                      event_us: np.ndarray | None = None) -> pa.Table:
    """On `rows` (a matured day's rows, after `apply_cutoff_arrow`): keep only the labels that
    became known after `parent_cutoff`. An objective without a window was known at the impression
    (the parent trained on it): mask 0; a delayed one keeps its mask where its window closed after
    the parent's cutoff, 0 where the parent already trained on it. `event_us`: the rows' impression
    times in int64 microseconds, when the caller already converted them."""
    if not rows.any():
        return tbl
    event = event_us if event_us is not None else _to_us(tbl.column("event_timestamp").to_pandas())
    before = _cutoff_us(parent_cutoff)
    for o in config.objective_names:
        mc = S.mask_column(o)
        if mc not in tbl.column_names:
            continue
        window = attribution_window(config, o)
        msk = pc.fill_null(tbl.column(mc), 0).to_numpy().copy()
        if window is None:
            msk[rows] = 0
        else:
            known_then = event + int(window / dt.timedelta(microseconds=1)) <= before
            msk[rows & known_then] = 0
        tbl = tbl.set_column(tbl.column_names.index(mc), mc, pa.array(msk, type=tbl.column(mc).type))
    return tbl
