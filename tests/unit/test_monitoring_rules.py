"""`monitoring.rules` on constructed series: each rule trips on its series and not on the mirror
of it; the state gives de-duplication, cooldown and the needs-a-person flag after a retrain."""

from __future__ import annotations

import pandas as pd
import pytest
from pydantic import ValidationError

from lattice.config.monitoring import CalibrationRule, DriftRule, Monitoring, NeRegressionRule
from lattice.monitoring.rules import check, decide

START = pd.Timestamp("2026-01-05", tz="UTC")


def _cells(values: list[float], figure: str = "calibration", positives: int = 300, version: int = 1,
           first_day: int = 0, days: list[int] | None = None) -> pd.DataFrame:
    days = days if days is not None else list(range(first_day, first_day + len(values)))
    starts = [START + pd.Timedelta(days=d) for d in days]
    return pd.DataFrame({
        "domain": "feed", "objective": "click", "model_version": version, "period_start": starts,
        "period": [s.strftime("%Y-%m-%d") for s in starts], "positives": positives,
        "calibration": values if figure == "calibration" else 1.0, "ne": values if figure == "ne" else 0.8})


def _drift(values: list[float]) -> pd.DataFrame:
    starts = [START + pd.Timedelta(days=d) for d in range(len(values))]
    return pd.DataFrame({"domain": "feed", "feature": "price", "period_start": starts,
                         "period": [s.strftime("%Y-%m-%d") for s in starts], "model_version": 1, "psi": values})


CAL = CalibrationRule(kind="calibration", low=0.9, high=1.1, min_positives=200, periods=2)
NONE = pd.DataFrame()


@pytest.mark.parametrize("series, trips", [
    ([1.0, 1.25, 1.3], True),     # over-predicting two days in a row
    ([1.3, 1.25, 1.0], False),    # its mirror in time: recovered on the last day
    ([1.0, 0.8, 0.85], True),     # under-predicting
    ([1.0, 1.05, 0.95], False),   # inside the bounds
    ([1.0, 1.0, 1.3], False),     # one day out is not two
])
def test_calibration_rule(series, trips):
    findings, _ = check([CAL], _cells(series), NONE)
    assert bool(findings) is trips
    if trips:
        assert findings[0]["figures"]["calibration"] == series[-2:] and findings[0]["periods"] == ["2026-01-06", "2026-01-07"]


def test_calibration_needs_positives_and_consecutive_periods():
    assert check([CAL], _cells([1.3, 1.3], positives=199), NONE)[0] == []  # too few labels to count
    assert check([CAL], _cells([1.3, 1.3], days=[0, 2]), NONE)[0] == []   # a gap: not in a row
    assert len(check([CAL], _cells([1.3, 1.3], days=[1, 2]), NONE)[0]) == 1


def test_calibration_judges_the_latest_version_only():
    old = _cells([1.3, 1.3], version=1)
    new = _cells([1.0], version=2, first_day=2)
    assert check([CAL], pd.concat([old, new]), NONE)[0] == []


def _with_sums(cells: pd.DataFrame, mean_p: float = 0.05) -> pd.DataFrame:
    """The positive count's mean (sum p) and variance (sum p(1-p)) the monitor keeps per period."""
    expected = cells["calibration"] * cells["positives"]
    return cells.assign(expected_positives=expected, positives_variance=expected * (1 - mean_p))


def test_calibration_outside_the_bounds_by_noise_alone_does_not_trip():
    # 115 positives: 1.2 is within ~2 standard deviations (±0.19) of a calibrated model
    noisy = _with_sums(_cells([1.2, 1.2], positives=115))
    rule = CalibrationRule(kind="calibration", low=0.9, high=1.1, min_positives=100, periods=1)
    assert check([rule], noisy, NONE)[0] == []
    point = rule.model_copy(update={"confidence": 0.0})  # the point estimate alone reads it as drift
    assert len(check([point], noisy, NONE)[0]) == 1
    # the same ratio over 2,000 positives is beyond noise; and a shock to 0.7 over 300 is too
    assert len(check([rule], _with_sums(_cells([1.2], positives=2000)), NONE)[0]) == 1
    found = check([rule], _with_sums(_cells([0.7], positives=300)), NONE)[0]
    assert len(found) == 1 and "beyond noise (95% interval)" in found[0]["reason"]
    low, high = found[0]["figures"]["interval"][0]
    assert low < 0.7 < high < 0.9 and found[0]["bounds"]["confidence"] == 0.95


def test_pooled_calibration_sees_a_steady_miscalibration_no_single_day_shows():
    # 115 positives a day at 1.2 for 7 days: no day's own interval is outside [0.9, 1.1], the
    # week's pooled one (805 positives) is
    steady = _with_sums(_cells([1.2] * 7, positives=115))
    daily = CalibrationRule(kind="calibration", low=0.9, high=1.1, min_positives=100, periods=1)
    assert check([daily], steady, NONE)[0] == []
    weekly = CalibrationRule(kind="calibration", low=0.9, high=1.1, min_positives=300, periods=7, pooled=True)
    found = check([weekly], steady, NONE)[0]
    assert len(found) == 1 and found[0]["figures"]["pooled"]["positives"] == 805
    low, high = found[0]["figures"]["pooled"]["interval"]
    assert 1.1 < low < 1.2 < high and "pooled" in found[0]["reason"]
    # a calibrated week with the same noise, its mirror in level, and too short a history: no trip
    assert check([weekly], _with_sums(_cells([1.05, 0.95] * 3 + [1.0], positives=115)), NONE)[0] == []
    assert check([weekly], _with_sums(_cells([1.2] * 6, positives=115)), NONE)[0] == []
    # min_positives applies to the pooled count: 7 days of 30 positives at 0.6 are 210 < 300
    few = _with_sums(_cells([0.6] * 7, positives=30))
    assert check([weekly], few, NONE)[0] == []
    assert len(check([weekly.model_copy(update={"min_positives": 200})], few, NONE)[0]) == 1
    # the cell within bounds again counts as healthy (it clears a finding's memory)
    healthy = check([weekly], _with_sums(_cells([1.0] * 7, positives=115)), NONE)[1]
    assert healthy == [{"key": "0:calibration:feed:click", "model_version": 1}]


@pytest.mark.parametrize("series, trips", [([0.05, 0.3], True), ([0.3, 0.05], False), ([0.1, 0.19], False)])
def test_drift_rule(series, trips):
    rule = DriftRule(kind="drift", feature="price", max_psi=0.2)
    assert bool(check([rule], NONE, _drift(series))[0]) is trips
    assert check([DriftRule(kind="drift", feature="activity", max_psi=0.2)], NONE, _drift(series))[0] == []


@pytest.mark.parametrize("series, trips", [([0.80, 0.81, 0.86], True), ([0.86, 0.81, 0.80], False), ([0.80, 0.83], False)])
def test_ne_regression_rule(series, trips):
    rule = NeRegressionRule(kind="ne_regression", max_increase=0.05, min_positives=200)
    found = check([rule], _cells(series, figure="ne"), NONE)[0]
    assert bool(found) is trips
    if trips:
        assert found[0]["bounds"]["reference_ne"] == 0.8


class _Memory:
    """The rules' state across monitor runs over growing series, as `lattice monitor` keeps it."""

    def __init__(self, cooldown_hours: float):
        self.state: dict = {"keys": {}}
        self.cooldown_hours = cooldown_hours

    def run(self, cells: pd.DataFrame) -> tuple[list, list]:
        findings, healthy = check([CAL], cells, NONE)
        tripped, person, self.state = decide(findings, healthy, self.state, cooldown_hours=self.cooldown_hours)
        return tripped, person


def test_dedup_cooldown_and_needs_person():
    memory = _Memory(cooldown_hours=48)
    run = memory.run

    v1 = _cells([1.3, 1.3])
    assert len(run(v1)[0]) == 1                                   # trips
    assert run(v1) == ([], [])                                    # the same finding again: de-duplicated
    assert run(_cells([1.3, 1.3, 1.3])) == ([], [])               # a day later, inside the 48 h cooldown
    assert len(run(_cells([1.3, 1.3, 1.3, 1.3]))[0]) == 1         # 48 h after the first report: trips again
    # a retrain (v2) still miscalibrated: flagged for a person, not retriggered
    after = pd.concat([_cells([1.3] * 4), _cells([1.3, 1.3], version=2, first_day=4)])
    tripped, person = run(after)
    assert tripped == [] and person[0]["needs_person"] and person[0]["model_version"] == 2
    assert run(pd.concat([after, _cells([1.3], version=2, first_day=6)]))[0] == []  # still only flagged
    # v2 back inside the bounds clears the flag; a later trip is a fresh one
    run(pd.concat([after, _cells([1.0], version=2, first_day=6)]))
    assert memory.state["keys"] == {}


def test_a_trip_after_the_cell_recovered_is_a_new_episode_not_a_failed_retrain():
    memory = _Memory(cooldown_hours=24)
    run = memory.run

    assert len(run(_cells([1.3, 1.3]))[0]) == 1                    # v1 trips on day 1
    assert run(_cells([1.3, 1.3, 1.0])) == ([], [])                 # v1 back inside on day 2: recovered, remembered
    assert memory.state["keys"] and all(k["recovered"] for k in memory.state["keys"].values())
    # a shock on day 3 under the retrain v2: a new trip (past the cooldown), not "the retrain failed"
    shocked = pd.concat([_cells([1.3, 1.3, 1.0]), _cells([1.3, 1.3], version=2, first_day=3)])
    tripped, person = run(shocked)
    assert len(tripped) == 1 and person == [] and tripped[0]["model_version"] == 2
    # ... and v2 tripping again after its own retrain (v3) is the failed retrain: a person looks
    again = pd.concat([shocked, _cells([1.3, 1.3], version=3, first_day=5)])
    tripped, person = run(again)
    assert tripped == [] and person[0]["needs_person"] and person[0]["model_version"] == 3
    # the mirror: v1 never recovered before v2 served -> v2's trip is flagged for a person
    run = _Memory(cooldown_hours=24).run
    run(_cells([1.3, 1.3]))
    tripped, person = run(pd.concat([_cells([1.3, 1.3, 1.3]), _cells([1.3, 1.3], version=2, first_day=3)]))
    assert tripped == [] and person[0]["needs_person"]


def test_recovered_cell_keeps_its_cooldown():
    run = _Memory(cooldown_hours=72).run
    assert len(run(_cells([1.3, 1.3]))[0]) == 1
    run(_cells([1.3, 1.3, 1.0]))  # recovered
    # v2 trips 48 h after v1's trip: inside the 72 h cooldown, so nothing yet
    assert run(pd.concat([_cells([1.3, 1.3, 1.0]), _cells([1.3, 1.3], version=2, first_day=2)])) == ([], [])


def test_retrain_that_worked_forgets_the_cell():
    state = {"keys": {}}
    f, h = check([CAL], _cells([1.3, 1.3]), NONE)
    _, _, state = decide(f, h, state, cooldown_hours=24)
    fixed = pd.concat([_cells([1.3, 1.3]), _cells([1.0], version=2, first_day=2)])
    f, h = check([CAL], fixed, NONE)
    _, _, state = decide(f, h, state, cooldown_hours=24)
    assert state["keys"] == {}


def test_rule_config_is_checked():
    m = Monitoring.model_validate({"rules": [{"kind": "calibration", "low": 0.9, "high": 1.1, "min_positives": 200, "periods": 2},
                                             {"kind": "drift", "feature": "price", "max_psi": 0.25},
                                             {"kind": "ne_regression", "max_increase": 0.05}]})
    assert [r.kind for r in m.rules] == ["calibration", "drift", "ne_regression"]
    with pytest.raises(ValidationError, match="low"):
        Monitoring.model_validate({"rules": [{"kind": "calibration", "low": 1.2, "high": 1.1}]})
    with pytest.raises(ValidationError, match="max_psy"):
        Monitoring.model_validate({"rules": [{"kind": "drift", "feature": "price", "max_psy": 0.2}]})
