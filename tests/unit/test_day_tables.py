"""`reach_forward`: a run over days that precede kept days also recomputes the kept days whose
trailing windows read them (a backfill out of order, a re-run for late files), and no others."""

from __future__ import annotations

import datetime as dt

from pipelines.day_tables import reach_forward


def _table(root, days):
    for d in days:
        (root / f"date={d}").mkdir(parents=True)
    return root


def test_the_kept_days_within_the_reach_after_the_run_are_added(tmp_path):
    root = _table(tmp_path / "t", [f"2026-01-{d:02d}" for d in range(1, 15)])
    run = (dt.datetime(2026, 1, 5), dt.datetime(2026, 1, 6))
    window, later = reach_forward(root, run, dt.timedelta(days=7))
    # Jan 12's first instant reads back to Jan 5 00:00; Jan 13's does not
    assert later == [f"2026-01-{d:02d}" for d in range(6, 13)]
    assert window == (dt.datetime(2026, 1, 5), dt.datetime(2026, 1, 13))
    # a 12-hour window reaches only into the next day
    assert reach_forward(root, run, dt.timedelta(hours=12))[1] == ["2026-01-06"]


def test_a_forward_run_a_first_run_or_no_window_are_left_alone(tmp_path):
    root = _table(tmp_path / "t", ["2026-01-01", "2026-01-02"])
    newest = (dt.datetime(2026, 1, 3), dt.datetime(2026, 1, 4))
    assert reach_forward(root, newest, dt.timedelta(days=7)) == (newest, [])
    assert reach_forward(tmp_path / "missing", newest, dt.timedelta(days=7)) == (newest, [])
    assert reach_forward(root, None, dt.timedelta(days=7)) == (None, [])
    # kept days further away than the reach are not touched
    far = _table(tmp_path / "far", ["2026-01-20"])
    run = (dt.datetime(2026, 1, 5), dt.datetime(2026, 1, 6))
    assert reach_forward(far, run, dt.timedelta(days=7)) == (run, [])
