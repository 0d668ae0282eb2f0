"""The demo's short life: a first training window, then daily rounds, each one day later.

The synthetic logs cover `time_range`; the demo lets the days arrive one at a time. The first window
holds every day but the last `days`; each round then brings one new day through the feature steps
(the features DAG's run for that day), continues yesterday's teacher and student on the days they
have not seen (`warm_start: last`), and gates the new student on the new day against the champion.

Each model is trained with its interval ending at the newest day in the table, so that day is its
test day and the gate judges it in the same round: a backtest, one day at a time. The DAGs train to
the end of their run's interval instead, and their gate waits for the next day
(docs/living-over-days.md); the steps and the stages are the same.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from lattice.config import PlatformConfig


class LifeError(ValueError):
    """The config's time range cannot hold a first window and the requested rounds."""


@dataclass(frozen=True)
class Round:
    """One pass of the chain: the feature days it brings, and the test day of the models it trains."""

    index: int
    start: dt.date
    """First day the feature steps process (inclusive)."""
    end: dt.date
    """Interval end of the feature steps (exclusive)."""
    test_day: dt.date
    """The newest day in the table after this round's features: the models' `end` (their test day)."""
    warm_start: str

    def feature_params(self) -> dict[str, str]:
        return {"start": self.start.isoformat(), "end": self.end.isoformat()}

    def model_params(self) -> dict[str, str]:
        return {"end": self.test_day.isoformat(), "warm_start": self.warm_start}


@dataclass(frozen=True)
class Life:
    window: str
    """`training.window` of every round (the config's, or the first window's length)."""
    rounds: tuple[Round, ...]


def plan(config: PlatformConfig, days: int) -> Life | None:
    """The rounds of a demo with `days` daily rounds after the first window (None for 0 rounds:
    the demo of one window and the config's split)."""
    if days <= 0:
        return None
    tr = config.time_range
    first_test = tr.end - dt.timedelta(days=days + 1)  # the last `days` days arrive one per round
    span = (first_test - tr.start).days  # days before the first test day
    if config.training.window is not None:
        from lattice.data.window import window_days

        window = config.training.window
        needed = window_days(window)
    else:
        window, needed = f"{span}d", span
    if needed < 3 or span < needed:
        raise LifeError(
            f"time_range [{tr.start}, {tr.end}) is too short for a first window of {needed} days and {days} daily "
            f"round(s) (each window needs at least 2 train days and a validation day); give fewer --days or a "
            f"longer time_range / synthetic.days")
    rounds = [Round(0, tr.start, first_test + dt.timedelta(days=1), first_test, "none")]
    for i in range(1, days + 1):
        day = first_test + dt.timedelta(days=i)
        rounds.append(Round(i, day, day + dt.timedelta(days=1), day, "last"))
    return Life(window, tuple(rounds))


def windowed(config: PlatformConfig, life: Life) -> PlatformConfig:
    """The config every round runs with: the life's training window set."""
    if config.training.window == life.window:
        return config
    return config.model_copy(update={"training": config.training.model_copy(update={"window": life.window})})


def round_record(round_: Round, summaries: dict[str, dict[str, Any]], lineage: dict[str, Any] | None) -> dict[str, Any]:
    """What the report shows of one round: the days the teacher trained on and where it came from,
    the examples it processed, and the gate's next-day decision with its per-cell series."""
    teacher = summaries.get("train_teacher") or {}
    gate = summaries.get("promote_challenger") or summaries.get("gate") or {}  # the decision as carried out
    m = gate.get("measurements") or {}
    lineage = lineage or {}
    parent = lineage.get("parent") or {}
    return {
        "round": round_.index, "features": [round_.start.isoformat(), round_.end.isoformat()],
        "test_day": round_.test_day.isoformat(), "warm_start": lineage.get("warm_start", round_.warm_start),
        "parent_days_seen": len(parent.get("days_seen") or []),
        "trained_days": lineage.get("trained_days") or [], "days_seen": len(lineage.get("days_seen") or []),
        "teacher_examples": sum(int(e.get("examples", 0)) for e in teacher.get("history") or []),
        "teacher_seconds": teacher.get("seconds"),
        "raw_rows_read": (summaries.get("consolidate") or {}).get("raw_rows_read"),
        "decision": gate.get("decision"), "passed": gate.get("passed"),
        "challenger_version": gate.get("challenger_version"),
        "champion_before": gate.get("champion_before"), "champion_after": gate.get("champion_after"),
        "judged_on": gate.get("judged_on"), "day_index": gate.get("day_index"),
        "next_day_macro_ne": {"challenger": m.get("student_macro_ne"), "champion": m.get("champion_macro_ne"),
                              "teacher": m.get("teacher_macro_ne")},
        "series": gate.get("series") or {},
        "failed_checks": [r.get("message") for r in gate.get("reasons") or [] if isinstance(r, dict) and not r.get("passed")],
    }
