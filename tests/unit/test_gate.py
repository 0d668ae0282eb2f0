"""The promotion gate's rules over measured numbers (no models, no registry)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lattice.config import load_config
from lattice.promotion.gate import CellMetrics, GateInputs, decide
from lattice.promotion.metrics import gate_cells

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config():
    return load_config(ROOT / "configs" / "demo.yaml")


def _cells(config, ne=0.8, auc=0.7, cal=1.0):
    return {c: CellMetrics(ne=ne, auc=auc, calibration=cal, count=1000, positives=50) for c in config.cells()}


def _inputs(config, challenger, champion, **kw):
    base = dict(student_macro_ne=0.80, teacher_macro_ne=0.79, export_max_abs_diff=1e-6, export_tolerance=1e-4,
                latency_p99_ms=1.0, artifact_mb=1.0)
    base.update(kw)
    return GateInputs(challenger=challenger, champion=champion, **base)


def test_good_challenger_passes(config):
    d = decide(config.promotion, _inputs(config, _cells(config, ne=0.80), _cells(config, ne=0.801)))
    assert d.passed, [r.message for r in d.failed]
    assert d.to_dict()["decision"] == "promote"
    assert {r.check for r in d.reasons} >= {"ne_vs_champion", "calibration", "teacher_epsilon", "export_parity", "latency", "artifact_size"}


def test_one_regressed_cell_rejects_and_is_named(config):
    delta = config.promotion.max_ne_regression
    challenger = _cells(config, ne=0.80)
    challenger[("search", "conversion")] = CellMetrics(ne=0.80 * (1 + 2 * delta), auc=0.7, calibration=1.0)
    d = decide(config.promotion, _inputs(config, challenger, _cells(config, ne=0.80)))
    assert not d.passed
    assert d.failed_cells == ["search/conversion"]
    assert "worse by" in d.failed[0].message


def test_regression_within_delta_passes(config):
    delta = config.promotion.max_ne_regression
    d = decide(config.promotion, _inputs(config, _cells(config, ne=0.80 * (1 + delta / 2)), _cells(config, ne=0.80)))
    assert d.passed


@pytest.mark.parametrize("cal", [0.5, 2.0])
def test_calibration_out_of_bounds_rejects(config, cal):
    challenger = _cells(config)
    challenger[("feed", "click")] = CellMetrics(ne=0.8, auc=0.7, calibration=cal)
    d = decide(config.promotion, _inputs(config, challenger, _cells(config)))
    assert [r.check for r in d.failed] == ["calibration"] and d.failed_cells == ["feed/click"]


@pytest.mark.parametrize("cal, champ_cal, passed", [(0.65, 0.55, True), (1.5, 1.8, True), (0.7, 1.5, True),
                                                     (0.65, 1.0, False), (0.55, 0.65, False), (1.8, 0.6, False)])
def test_calibration_out_of_bounds_passes_only_when_the_champion_is_further_off(config, cal, champ_cal, passed):
    """After a shock the served model is off too: a challenger nearer 1 (in ratio) on the same rows
    replaces it; one that is further off, or a good champion, keeps the rejection."""
    challenger, champion = _cells(config), _cells(config)
    challenger[("search", "click")] = CellMetrics(ne=0.8, auc=0.7, calibration=cal)
    champion[("search", "click")] = CellMetrics(ne=0.8, auc=0.7, calibration=champ_cal)
    d = decide(config.promotion, _inputs(config, challenger, champion))
    assert d.passed is passed, [r.message for r in d.reasons if r.cell == "search/click"]
    msg = next(r.message for r in d.reasons if r.check == "calibration" and r.cell == "search/click")
    assert ("closer to 1 than the champion" in msg) is passed


def test_first_model_uses_floors(config):
    assert decide(config.promotion, _inputs(config, _cells(config, ne=0.9, auc=0.7), None)).passed
    # 5,000 positives a cell: an AUC of 0.5 is surely below the 0.55 floor (its interval is ±0.01)
    big = {c: CellMetrics(ne=1.01, auc=0.5, calibration=1.0, count=100_000, positives=5_000) for c in config.cells()}
    d = decide(config.promotion, _inputs(config, big, None))
    assert {r.check for r in d.failed} == {"ne_floor", "auc_floor"}
    assert len(d.failed_cells) == len(config.cells())


@pytest.mark.parametrize(
    "override, check",
    [
        (dict(student_macro_ne=0.90, teacher_macro_ne=0.80), "teacher_epsilon"),
        (dict(teacher_macro_ne=None), "teacher_epsilon"),
        (dict(export_max_abs_diff=0.1), "export_parity"),
        (dict(latency_p99_ms=1e3), "latency"),
        (dict(artifact_mb=1e6), "artifact_size"),
    ],
)
def test_model_level_checks(config, override, check):
    d = decide(config.promotion, _inputs(config, _cells(config), _cells(config), **override))
    assert not d.passed and [r.check for r in d.failed] == [check]


def test_empty_window_rejects(config):
    d = decide(config.promotion, _inputs(config, {}, None))
    assert not d.passed and "empty" in d.failed[0].message


def test_cell_metrics_skip_masked_rows(config):
    import pandas as pd

    rng = np.random.default_rng(1)
    n = 3000
    frame = pd.DataFrame({"domain": rng.choice(config.domain_names, n)})
    probs = {}
    for o in config.objective_names:
        frame[f"label_{o}"] = (rng.uniform(size=n) < 0.2).astype(np.int8)
        frame[f"mask_{o}"] = frame["domain"].map(lambda d, o=o: int(config.carries(d, o))).astype(np.int8)
        probs[o] = np.full(n, 0.2)
    cells = gate_cells(config, frame, probs)
    assert set(cells) == set(config.cells())
    assert ("video", "conversion") not in cells
    assert all(abs(m.calibration - 1) < 0.2 for m in cells.values())


def _cal_cell(positives: int, cal: float, rate: float = 0.01) -> CellMetrics:
    """A cell whose predictions sum to cal * positives, spread evenly over positives / rate rows."""
    n = int(positives / rate)
    p = cal * positives / n
    return CellMetrics(ne=0.8, auc=0.7, calibration=cal, count=n, positives=positives, expected=cal * positives,
                       variance=n * p * (1 - p))


def test_calibration_just_outside_the_bounds_in_a_small_cell_is_noise(config):
    """The demo's first model was rejected for search/conversion at 1.257 vs 1.25 over ~150
    positives: the positive count alone varies by ±12 there, so that is no evidence."""
    challenger = _cells(config)
    challenger[("search", "conversion")] = _cal_cell(150, 1.257)
    d = decide(config.promotion, _inputs(config, challenger, _cells(config)))
    assert d.passed, [r.message for r in d.failed]
    msg = next(r.message for r in d.reasons if r.check == "calibration" and r.cell == "search/conversion")
    assert "within noise" in msg and "150 positives" in msg


def test_the_same_calibration_in_a_large_cell_rejects(config):
    challenger = _cells(config)
    challenger[("search", "conversion")] = _cal_cell(20_000, 1.35)  # interval [1.33, 1.37] over 20k positives
    d = decide(config.promotion, _inputs(config, challenger, _cells(config)))
    assert d.failed_cells == ["search/conversion"]
    assert "outside the bounds" in d.failed[0].message


def test_calibration_confidence_zero_checks_the_point_estimate(config):
    strict = config.promotion.model_copy(update={"calibration_confidence": 0.0})
    challenger = _cells(config)
    challenger[("search", "conversion")] = _cal_cell(150, 1.257)
    assert decide(strict, _inputs(config, challenger, _cells(config))).failed_cells == ["search/conversion"]


def test_auc_floor_is_judged_by_its_interval(config):
    """A first model's AUC of 0.39 over 8 positives is noise around the 0.55 floor; over 2,000
    positives it is a model that ranks badly."""
    small = _cells(config)
    small[("search", "conversion")] = CellMetrics(ne=0.9, auc=0.39, calibration=1.0, count=800, positives=8)
    assert decide(config.promotion, _inputs(config, small, None)).passed
    large = _cells(config)
    large[("search", "conversion")] = CellMetrics(ne=0.9, auc=0.39, calibration=1.0, count=200_000, positives=2_000)
    d = decide(config.promotion, _inputs(config, large, None))
    assert d.failed_cells == ["search/conversion"] and "below the floor" in d.failed[0].message


def test_ne_floor_is_judged_by_its_interval(config):
    noisy = _cells(config)
    noisy[("search", "conversion")] = CellMetrics(ne=1.01, auc=0.6, calibration=1.0, count=800, positives=8, ne_se=0.02)
    assert decide(config.promotion, _inputs(config, noisy, None)).passed
    sure = _cells(config)
    sure[("search", "conversion")] = CellMetrics(ne=1.01, auc=0.6, calibration=1.0, count=10**6, positives=10**4, ne_se=0.001)
    d = decide(config.promotion, _inputs(config, sure, None))
    assert d.failed_cells == ["search/conversion"] and "above the floor" in d.failed[0].message


def test_ne_standard_error_covers_the_sampling_noise_of_ne():
    """Over many windows of a calibrated model's own labels, NE scatters by about its standard error."""
    from lattice.evaluation.metrics import ne, ne_standard_error

    rng = np.random.default_rng(0)
    p = rng.uniform(0.01, 0.2, size=5_000)
    nes, ses = [], []
    for _ in range(200):
        y = (rng.random(len(p)) < p).astype(float)
        nes.append(ne(y, p))
        ses.append(ne_standard_error(y, p))
    assert np.std(nes) == pytest.approx(np.mean(ses), rel=0.25)


def test_fp8_artifact_is_held_to_its_own_weights_in_fp32_in_every_cell(config):
    tol = config.promotion.fp8_tolerance
    fp32 = _cells(config, ne=0.80)
    close = decide(config.promotion, _inputs(config, _cells(config, ne=0.80 * (1 + tol / 2)), None, fp8_fp32=fp32))
    checks = [r for r in close.reasons if r.check == "fp8_parity"]
    assert len(checks) == len(fp32) and all(r.passed for r in checks)
    worse = dict(_cells(config, ne=0.80))
    cell = sorted(worse)[0]
    worse[cell] = _cells(config, ne=0.80 * (1 + 2 * tol))[cell]
    d = decide(config.promotion, _inputs(config, worse, None, fp8_fp32=fp32))
    assert not d.passed
    assert [r.cell for r in d.failed if r.check == "fp8_parity"] == ["/".join(cell)]
    # no FP8 site: no fp8 check at all
    assert not [r for r in decide(config.promotion, _inputs(config, fp32, None)).reasons if r.check == "fp8_parity"]


def _paired(config, ratio, se):
    from lattice.promotion.gate import PairedNE

    return {c: PairedNE(ratio, se) for c in config.cells()}


@pytest.mark.parametrize("se, passed", [(0.02, True), (0.001, False)])
def test_ne_regression_is_judged_by_its_paired_interval(config, se, passed):
    """A cell 1.6% worse than the champion against δ = 1%: within noise when the paired error is
    2% (a small conversion cell), beyond it when the error is 0.1% (a large click cell)."""
    p = config.promotion.model_copy(update={"max_ne_regression": 0.01})
    challenger, champion = _cells(config, ne=0.80 * 1.016), _cells(config, ne=0.80)
    d = decide(p, _inputs(config, challenger, champion, paired=_paired(config, 1.016, se)))
    assert d.passed is passed, [r.message for r in d.failed]
    msg = next(r.message for r in d.reasons if r.check == "ne_vs_champion")
    assert ("within noise" if passed else "beyond noise") in msg and "paired interval" in msg


def test_ne_regression_without_a_paired_error_or_at_zero_confidence_is_a_point_check(config):
    p = config.promotion.model_copy(update={"max_ne_regression": 0.01})
    challenger, champion = _cells(config, ne=0.80 * 1.016), _cells(config, ne=0.80)
    assert not decide(p, _inputs(config, challenger, champion)).passed
    p0 = p.model_copy(update={"calibration_confidence": 0.0})
    assert not decide(p0, _inputs(config, challenger, champion, paired=_paired(config, 1.016, 0.02))).passed


def test_paired_ne_ratio_error_covers_the_noise_of_the_ratio():
    """Two models on the same rows: over many label draws the NE ratio scatters by about its paired
    standard error, which is clearly smaller than the NE's own (relative) error."""
    from lattice.evaluation.metrics import ne, ne_standard_error, paired_ne_ratio

    rng = np.random.default_rng(3)
    truth = rng.uniform(0.01, 0.2, size=5_000)
    a = np.clip(truth * rng.lognormal(0, 0.3, size=len(truth)), 1e-4, 0.99)  # a noisier model
    ratios, ses, own = [], [], []
    for _ in range(200):
        y = (rng.random(len(truth)) < truth).astype(float)
        r, se = paired_ne_ratio(y, a, truth)
        assert r == pytest.approx(ne(y, a) / ne(y, truth), rel=1e-9)
        ratios.append(r)
        ses.append(se)
        own.append(ne_standard_error(y, a) / ne(y, a))
    assert np.std(ratios) == pytest.approx(np.mean(ses), rel=0.25)
    assert np.mean(ses) < 0.75 * np.mean(own)
    assert np.isnan(paired_ne_ratio(np.zeros(10), a[:10], truth[:10])).all()  # no positive: no NE
