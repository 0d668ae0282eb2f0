"""The demo's daily rounds (lattice.demo.life): which days each round brings and trains to, the
window every round uses, a time range too short refused, and the report's days section."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from lattice.config import load_config
from lattice.demo.life import LifeError, plan, round_record, windowed
from lattice.demo.report_days import day_series, days_html

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo_config():
    return load_config(ROOT / "configs" / "demo.yaml")


def test_no_rounds_is_the_one_window_demo(demo_config):
    assert plan(demo_config, 0) is None


def test_two_rounds_bring_the_last_two_days_one_at_a_time(demo_config):
    tr = demo_config.time_range  # [2026-01-01, 2026-01-15)
    life = plan(demo_config, 2)
    assert life.window == "11d"  # Jan 1..11: ten train days and the validation day before the first test day
    first, *later = life.rounds
    assert (first.start, first.end, first.test_day, first.warm_start) == (
        tr.start, dt.date(2026, 1, 13), dt.date(2026, 1, 12), "none")
    assert [(r.start, r.end, r.test_day, r.warm_start) for r in later] == [
        (dt.date(2026, 1, 13), dt.date(2026, 1, 14), dt.date(2026, 1, 13), "last"),
        (dt.date(2026, 1, 14), dt.date(2026, 1, 15), dt.date(2026, 1, 14), "last")]
    # the last round's features end where the config's time range ends: no day is read twice or skipped
    assert later[-1].end == tr.end
    assert first.model_params() == {"end": "2026-01-12", "warm_start": "none"}
    assert later[0].feature_params() == {"start": "2026-01-13", "end": "2026-01-14"}
    assert windowed(demo_config, life).training.window == "11d"
    assert demo_config.training.window is None  # the config itself is left as it was


def test_a_config_window_is_kept(demo_config):
    cfg = demo_config.model_copy(update={"training": demo_config.training.model_copy(update={"window": "5d"})})
    life = plan(cfg, 3)
    assert life.window == "5d" and windowed(cfg, life) is cfg
    assert [r.test_day.day for r in life.rounds] == [11, 12, 13, 14]


def test_too_many_rounds_for_the_time_range_is_refused(demo_config):
    with pytest.raises(LifeError, match="too short.*--days"):
        plan(demo_config, 11)
    cfg = demo_config.model_copy(update={"training": demo_config.training.model_copy(update={"window": "13d"})})
    with pytest.raises(LifeError, match="13 days"):
        plan(cfg, 2)


def _gate(version, before, after, ch, champ, passed=True):
    series = {f"next_day.challenger.feed.click.ne": [ch, 11], f"next_day.challenger.feed.click.auc": [0.7, 11]}
    if champ is not None:
        series["next_day.champion.feed.click.ne"] = [champ, 11]
    return {"decision": "promote" if passed else "reject", "passed": passed, "challenger_version": version,
            "champion_before": before, "champion_after": after, "judged_on": "2026-01-13", "day_index": 12,
            "measurements": {"student_macro_ne": ch, "champion_macro_ne": champ if champ is not None else float("nan"),
                             "teacher_macro_ne": 0.95},
            "series": series,
            "reasons": [{"check": "ne", "passed": passed, "message": "feed/click NE 0.99 vs 0.97"}]}


def test_round_record_and_report_section(demo_config):
    life = plan(demo_config, 2)
    lineage = {"warm_start": "last", "parent": {"days_seen": ["2026-01-01", "2026-01-02"]},
               "trained_days": ["2026-01-11"], "days_seen": ["2026-01-01", "2026-01-02", "2026-01-11"]}
    summaries = {"train_teacher": {"history": [{"examples": 700}, {"examples": 700}], "seconds": 3.0},
                 "consolidate": {"raw_rows_read": 8000},
                 "promote_challenger": _gate(2, 1, 1, 0.99, 0.97, passed=False)}
    rec = round_record(life.rounds[1], summaries, lineage)
    assert rec["teacher_examples"] == 1400 and rec["trained_days"] == ["2026-01-11"] and rec["parent_days_seen"] == 2
    assert rec["decision"] == "reject" and rec["failed_checks"] == ["feed/click NE 0.99 vs 0.97"]
    assert rec["next_day_macro_ne"] == {"challenger": 0.99, "champion": 0.97, "teacher": 0.95}
    assert day_series([rec]) == {"feed/click": {"challenger": [("2026-01-13", 0.99)], "champion": [("2026-01-13", 0.97)]}}
    page = "\n".join(days_html({"days": {"window": "11d", "rounds": [rec]}}))
    assert "Daily rounds" in page and "v1 → v1" in page and "reject" in page and "data:image/png;base64," in page
    assert days_html({}) == []
