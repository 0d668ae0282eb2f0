"""The training window: which days of the example table a run trains, validates and is tested on.

With `training.window: Nd` a run trains on the N days that end at its interval end `end`
(exclusive): days end-N .. end-2 are the train split, the newest day end-1 is the validation split
and the day after the window, `end`, is the test split (a model is judged on a day it has never
seen). The decision is a function of the `date` each example is stored with (the table's
partition column, written once by the feature stage) and the run's window, so every reader of one
run (trainer, scorer, gate) takes the same rows; it overrides the stored `split` column for that run.

A warm-started run narrows the train days to those its parent has not trained on, plus a
`replay` share of the older ones chosen by a hash of the example id: with `replay_rows: fixed` the
same rows every run, with `rotating` the hash is salted with the run's test day, so each run
replays another share (deterministic per run: a re-run of a day replays the same rows).

`training.window_validation` below 1 holds out only that share of the newest day (by the same
hash) and trains on the rest of it: a run then learns from the day just before its test day, which
is what lets a retrain started by a shock learn the shock a day sooner (bench/bench_market_life.py,
part C). The day counts as trained in the lineage; its held-out rows are never trained later.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from lattice.config import PlatformConfig

_DAYS = re.compile(r"^([1-9][0-9]*)d$")


def window_days(text: str) -> int:
    m = _DAYS.match(text)
    if not m:
        raise ValueError(f"training.window {text!r}: give a whole number of days such as '14d'")
    return int(m.group(1))


def as_date(value: str | dt.date | dt.datetime) -> dt.date:
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    try:
        return dt.date.fromisoformat(str(value)[:10])
    except ValueError:
        raise ValueError(f"end {value!r}: give a date as YYYY-MM-DD (the run's interval end, exclusive)") from None


@dataclass
class DaySplits:
    """date (YYYY-MM-DD) -> split for one run; `replay`: older train days kept at `replay_share`;
    `validation_share` < 1: only that share of the validation day's rows (by a hash of the example
    id) is validation, the rest of the day trains."""

    days: dict[str, str]
    replay: list[str] = field(default_factory=list)
    replay_share: float = 0.0
    validation_share: float = 1.0
    matured: list[str] = field(default_factory=list)
    """Days the parent trained on while some of their labels were still masked (label_delay: mask)
    and whose labels have become known since: their rows train again, on those labels only
    (`newly_known_rows`, lattice.data.label_time.train_newly_known)."""
    parent_cutoff: str | None = None
    """The parent's cutoff (ISO), which decides what it already knew of a matured day."""
    replay_salt: str | None = None
    """Salts the replay hash (`training.replay_rows: rotating`: the run's test day), so that each
    run replays another share of the older days' rows; None replays the same rows every run."""

    def split_of(self, dates: Iterable[str], example_ids: Iterable[str] | None, split: str) -> np.ndarray:
        """Boolean mask of the rows of `split` ("all": every row of the window and its test day)."""
        dates = np.asarray(list(dates), dtype=object)
        values = np.array([self.days.get(d, "") for d in dates.tolist()], dtype=object)
        keep = values != "" if split == "all" else values == split
        from lattice.data.split import hash_fraction

        if self.validation_share < 1 and split in ("train", "validation"):
            shared = values == "validation"
            if shared.any():
                ids = np.asarray(list(example_ids), dtype=object)
                held = np.zeros(len(dates), bool)
                held[shared] = hash_fraction(ids[shared].tolist()) < self.validation_share
                keep = keep & held if split == "validation" else keep | (shared & ~held)
        if self.replay and split in ("train", "all") and self.replay_share > 0:
            keep |= self._replayed(dates, example_ids)
        if self.matured and split in ("train", "all"):
            keep |= np.isin(dates, self.matured)
        return keep

    def _replayed(self, dates: np.ndarray, example_ids) -> np.ndarray:
        chosen = np.zeros(len(dates), bool)
        old = np.isin(dates, self.replay)
        if old.any() and self.replay_share > 0:
            ids = np.asarray(list(example_ids), dtype=object)[old].tolist()
            chosen[old] = replay_fraction(ids, self.replay_salt) < self.replay_share
        return chosen

    def newly_known_rows(self, dates: Iterable[str], example_ids: Iterable[str]) -> np.ndarray:
        """Rows of the matured days that train only on what became known since the parent's
        cutoff (a replayed row trains on all its labels, as every replayed row does)."""
        dates = np.asarray(list(dates), dtype=object)
        if not self.matured:
            return np.zeros(len(dates), bool)
        return np.isin(dates, self.matured) & ~self._replayed(dates, list(example_ids))

    def wanted(self, date: str) -> bool:
        return date in self.days or date in self.replay or date in self.matured

    def train_days(self) -> list[str]:
        """The days this run trains on (not the replayed ones): its train days and, when only a
        share of it is held out, the validation day."""
        return sorted(d for d, s in self.days.items() if s == "train" or (s == "validation" and self.validation_share < 1))

    def validation_day(self) -> str | None:
        return next((d for d, s in self.days.items() if s == "validation"), None)

    def cutoff(self) -> dt.datetime | None:
        """The instant a run of these days trains at: midnight (UTC) after its newest train or
        validation day, i.e. the start of its test day. Labels are taken as known at this instant
        (lattice.data.label_time), so a conversion that arrives on the test day is not yet known."""
        seen = [d for d, s in self.days.items() if s in ("train", "validation")] + list(self.replay)
        if not seen:
            return None
        return dt.datetime.combine(dt.date.fromisoformat(max(seen)) + dt.timedelta(days=1), dt.time())

    def to_json(self) -> dict:
        return {"days": self.days, "replay": self.replay, "replay_share": self.replay_share,
                "validation_share": self.validation_share, "matured": self.matured, "parent_cutoff": self.parent_cutoff,
                "replay_salt": self.replay_salt}

    @classmethod
    def from_json(cls, d: dict | None) -> "DaySplits | None":
        if d is None:
            return None
        return cls(dict(d["days"]), list(d.get("replay", [])), float(d.get("replay_share", 0.0)),
                   float(d.get("validation_share", 1.0)), list(d.get("matured", [])), d.get("parent_cutoff"),
                   d.get("replay_salt"))


def replay_fraction(example_ids: list, salt: str | None) -> np.ndarray:
    """u in [0, 1) per id for the replay choice (a row is replayed when u < the share): the id's
    own hash, or with `salt` (a run's test day) a hash of the id and the salt."""
    from lattice.data.split import hash_fraction

    return hash_fraction(example_ids if salt is None else [f"{e}|replay|{salt}" for e in example_ids])


@dataclass(frozen=True)
class TrainWindow:
    """One run's days: `train` (oldest first), `validation` (the window's newest day), `test` (the
    day after the window), and `end`, the interval end the window was cut at (exclusive)."""

    train: tuple[str, ...]
    validation: str
    test: str
    end: str

    @property
    def days(self) -> list[str]:
        """The window's days, oldest first (train days and the validation day)."""
        return [*self.train, self.validation]

    def splits(self, trained_before: Iterable[str] = (), replay_share: float = 0.0, validation_share: float = 1.0,
               rotate_replay: bool = False) -> DaySplits:
        """The run's day -> split map; days in `trained_before` (a warm start's parent already
        trained on them) leave the train split, except a `replay_share` of their rows (another
        share each run with `rotate_replay`); `validation_share` < 1 trains on the rest of the
        validation day."""
        seen = set(trained_before)
        days = {d: "train" for d in self.train if d not in seen}
        days[self.validation] = "validation"
        days[self.test] = "test"
        replay = [d for d in self.train if d in seen] if replay_share > 0 else []
        salt = self.test if replay and rotate_replay else None
        return DaySplits(days, replay, replay_share, validation_share, replay_salt=salt)

    def to_json(self) -> dict:
        return {"train": list(self.train), "validation": self.validation, "test": self.test, "end": self.end}


def latest_date(table: Path) -> dt.date:
    """The newest event date of the table: from its `date=` partition folders, else its rows."""
    parts = sorted({p.name.split("=", 1)[1] for p in Path(table).rglob("date=*") if p.is_dir()})
    if parts:
        return as_date(parts[-1])
    import pyarrow.dataset as ds

    t = ds.dataset(str(table), format="parquet", partitioning="hive").to_table(columns=["event_timestamp"])
    if t.num_rows == 0:
        raise ValueError(f"the example table {table} holds no rows: there is no latest day to end a window at")
    import pyarrow.compute as pc

    return as_date(pc.max(t.column("event_timestamp")).as_py())


def resolve(config: PlatformConfig, table: Path, end: str | dt.date | None = None) -> TrainWindow | None:
    """The run's window (None without `training.window`). `end`: the interval end (exclusive),
    default the table's latest event date + 1 day, whose test day is then still in the future."""
    if config.training.window is None:
        return None
    n = window_days(config.training.window)
    if n < 2:
        raise ValueError(f"training.window {config.training.window!r}: a window needs at least 2 days "
                         "(the newest is held out for validation); use '2d' or more")
    stop = as_date(end) if end is not None else latest_date(table) + dt.timedelta(days=1)
    days = [(stop - dt.timedelta(days=n - i)).isoformat() for i in range(n)]
    return TrainWindow(tuple(days[:-1]), days[-1], stop.isoformat(), stop.isoformat())


@dataclass(frozen=True)
class FitDays:
    """The days a fit made for one run reads (`lattice trees fit`, `lattice hashing fit`): the run's
    window (None without training.window), its day -> split map, and what the fit records."""

    window: "TrainWindow | None"
    splits: DaySplits | None
    record: dict | None
    """The window and the share of its newest day held out, as a fit's manifest keeps it."""


def held_out_share(config: PlatformConfig, validation_share: float | None) -> float:
    """The share of the window's newest day a run holds out: its own (a retrain a rule started
    passes one), else training.window_validation."""
    return config.training.window_validation if validation_share is None else validation_share


def fit_days(config: PlatformConfig, table: Path, end: str | None, validation_share: float | None) -> FitDays:
    """The train / validation days of the run that ends at `end` with `validation_share` of its
    newest day held out (training.window_validation by default), as `train` resolves them."""
    window = resolve(config, table, end)
    if window is None:
        return FitDays(None, None, None)
    held_out = held_out_share(config, validation_share)
    return FitDays(window, window.splits(validation_share=held_out), {**window.to_json(), "validation_share": held_out})


def fitted_elsewhere(recorded: dict | None, window: "TrainWindow | None", validation_share: float) -> str | None:
    """Why a fit recorded on `recorded` days (`FitDays.record`, None: the stored split) may have seen
    labels of a run on `window` holding out `validation_share` of its newest day: "the window
    A..B", "the table's stored split (no window)", or the share it held out; None when it may serve.
    A fit that held out at least the run's share of the same days serves it."""
    wanted = window.to_json() if window is not None else None
    if recorded is None and wanted is None:
        return None
    same = (recorded is not None and wanted is not None and recorded["train"] == wanted["train"]
            and recorded["validation"] == wanted["validation"])
    if same and float(recorded.get("validation_share", 1.0)) >= validation_share:
        return None
    on = f"the window {recorded['train'][0]}..{recorded['validation']}" if recorded else "the table's stored split (no window)"
    if same:
        on += f" holding out {recorded.get('validation_share', 1.0):g} of its newest day (this run: {validation_share:g})"
    return on


def row_dates(tbl, partition: dict[str, str]) -> list[str]:
    """Each row's stored date (YYYY-MM-DD): its `date` partition, its `date` column, or its event time."""
    if "date" in partition:
        return [partition["date"]] * tbl.num_rows
    if "date" in tbl.column_names:
        return [str(v)[:10] for v in tbl.column("date").to_pylist()]
    if "event_timestamp" in tbl.column_names:
        return [v.date().isoformat() if v is not None else "" for v in tbl.column("event_timestamp").to_pylist()]
    raise ValueError("a windowed run (training.window) needs each example's date: the table has no `date` "
                     "partition or column and no `event_timestamp`; rebuild it with `lattice features CONFIG`")
