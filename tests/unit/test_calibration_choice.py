"""The calibration map is chosen per cell (issue 38): kept where it improves validation NE beyond
noise out of fold, dropped (the cell scores raw, in the eager model and in the artifact) elsewhere;
the report flags a cell whose test calibration the step moved further from 1 beyond noise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from lattice.config import load_config
from lattice.evaluation.calibration_shift import calibration_shift
from lattice.evaluation.report import calibration_lines, calibration_table
from lattice.models import build_model
from lattice.models.calibrated import Calibrated, CellCalibration
from lattice.training import calibration as C
from lattice.training.tiny import tiny
from tolerances import assert_same_kernels_close

ROOT = Path(__file__).resolve().parents[2]
OFF = {"feed/click", "video/click", "feed/conversion"}
"""Cells whose raw logits are constructed miscalibrated (a map helps); the others are calibrated
already (a map can only fit noise)."""


@pytest.fixture(scope="module")
def demo():
    return load_config(ROOT / "configs" / "demo.yaml")


def _frame(config, n: int, seed: int) -> pd.DataFrame:
    """Validation-like rows: cells in OFF have logits over-spread and shifted against the truth,
    the other cells' logits are the truth's own (perfectly calibrated)."""
    rng = np.random.default_rng(seed)
    domains = rng.choice(config.domain_names, n)
    f = {"example_id": [f"e{i:06d}" for i in range(n)], "domain": domains}
    for o in config.objective_names:
        truth = rng.normal(-2.5 if o == "conversion" else -1.5, 1.0, n)
        y = (rng.random(n) < 1 / (1 + np.exp(-truth))).astype(np.float32)
        off = np.isin(np.char.add(domains.astype(str), f"/{o}"), list(OFF))
        f[f"z_{o}"] = np.where(off, (truth - 0.6) / 0.6, truth).astype(np.float32)
        f[f"label_{o}"], f[f"mask_{o}"] = y, np.ones(n, np.float32)
    return pd.DataFrame(f)


def _scores(config, frame, maps):
    return C.calibrated_probabilities(config, frame, CellCalibration(maps)), C.calibrated_probabilities(config, frame, None)


def test_a_map_that_does_not_help_on_validation_is_dropped_and_the_cell_scores_raw(demo) -> None:
    frame = _frame(demo, 15_000, seed=1)
    # isotonic with no floor: on a calibrated cell its blocks fit the labels' noise, which the
    # held-out half pays for (the map hurts out of fold)
    maps = C.fit_maps(demo, frame, "isotonic", min_positives=0, choice="validated")
    assert maps["version"] == C.MAPS_VERSION and maps["choice"] == "validated"
    cal, raw = _scores(demo, frame, maps)
    for cell, m in maps["cells"].items():
        d, o = cell.split("/")
        rows = (frame["domain"] == d).to_numpy()
        ch = m["choice"]
        if cell in OFF:
            assert ch["kept"] and m["method"] == "isotonic", (cell, ch)
            assert ch["val_ne_after"] < ch["val_ne_before"] and ch["high"] < 0, (cell, ch)
            assert not np.allclose(cal[o][rows], raw[o][rows]), cell
        else:
            assert ch["ne_diff"] > 0, (cell, ch)  # the cross-fitted map really hurts here
            assert not ch["kept"] and m["method"] == "none" and m["candidate"]["method"] == "isotonic", (cell, ch)
            assert "not below 0" in ch["reason"]
            # a dropped cell passes its logits through untouched: the same float32 values
            assert np.array_equal(cal[o][rows], raw[o][rows]), cell


def test_always_keeps_every_map_and_old_maps_still_apply_every_cell(demo) -> None:
    frame = _frame(demo, 6000, seed=2)
    always = C.fit_maps(demo, frame, "platt", choice="always")
    assert all("choice" not in m and m["method"] == "platt" for m in always["cells"].values())
    cal, raw = _scores(demo, frame, always)
    assert all(not np.allclose(cal[o], raw[o]) for o in demo.objective_names)
    # maps written before the choice existed (no version, no choice) load and apply every cell
    old = {k: v for k, v in always.items() if k not in ("version", "choice")}
    again, _ = _scores(demo, frame, old)
    for o in demo.objective_names:
        assert np.array_equal(again[o], cal[o]), o  # the same module built from the same knots


def test_the_cross_fit_judges_each_row_by_a_map_that_never_saw_its_label(demo, monkeypatch) -> None:
    frame = _frame(demo, 3000, seed=3)
    fitted_on: list[np.ndarray] = []
    real = C.fit_cell

    def spy(z, y, method, min_positives=0):
        fitted_on.append(np.asarray(z, np.float64).copy())
        return real(z, y, method, min_positives)

    monkeypatch.setattr(C, "fit_cell", spy)
    z = frame["z_click"].to_numpy(np.float64)
    feed = (frame["domain"] == "feed").to_numpy()
    judged = C.judged_logits(demo, frame, None, "platt", 0, judge="crossfit")["click"]
    # per cell two fits on disjoint halves (click's feed cell is the first cell fitted)
    halves = fitted_on[:2]
    assert sum(len(h) for h in halves) == feed.sum() and not set(halves[0]) & set(halves[1])
    for k, held in enumerate((halves[1], halves[0])):  # fold k's map scores the other half
        m = real(halves[k], frame.loc[feed & np.isin(z, halves[k]), "label_click"].to_numpy(), "platt", 0)
        rows = feed & np.isin(z, held)
        np.testing.assert_allclose(judged[rows], C.apply_cell(m, z[rows]), rtol=0, atol=0)


def test_eager_and_exported_models_agree_with_kept_and_dropped_cells(demo) -> None:
    from lattice.export.serving_module import script

    cfg = tiny(demo)
    frame = _frame(cfg, 15_000, seed=4)
    maps = C.fit_maps(cfg, frame, "isotonic", min_positives=0, choice="validated")
    kept = {c for c, m in maps["cells"].items() if m["choice"]["kept"]}
    assert kept == OFF  # a mix: click kept in feed and video, dropped in search
    torch.manual_seed(0)
    net = build_model(cfg, "teacher", 4).eval()
    model = Calibrated(net, CellCalibration(maps)).eval()
    scripted = script(model)
    rng = np.random.default_rng(5)
    from lattice.data.batch import kjt_from_ids

    names = [f.name for f in cfg.features.sparse]
    n = 400
    kjt = kjt_from_ids(names, [rng.integers(0, 50, n) for _ in names], [rng.random(n) < 0.9 for _ in names])
    dense = torch.as_tensor(rng.normal(size=(n, 4)), dtype=torch.float32)
    domain = torch.as_tensor(rng.integers(0, len(cfg.domain_names), n))
    with torch.no_grad():
        eager = {o: torch.sigmoid(v) for o, v in model(dense, kjt, domain).items()}
        raw = {o: torch.sigmoid(v) for o, v in net(dense, kjt, domain).items()}
        served = scripted(dense, kjt, domain)
    for o in cfg.objective_names:
        # the artifact pools with aten's embedding_bag, the eager model with fbgemm's TBE: float32
        # sums in another order (tests/tolerances.py)
        assert_same_kernels_close(served[o], eager[o], o)
        for i, d in enumerate(cfg.domain_names):
            rows = domain == i
            if f"{d}/{o}" not in maps["cells"]:
                continue
            if f"{d}/{o}" in kept:
                assert not torch.allclose(eager[o][rows], raw[o][rows]), (d, o)
            else:
                # the same network on the same inputs, logits passed through: identical values
                assert torch.equal(eager[o][rows], raw[o][rows]), (d, o)
                assert_same_kernels_close(served[o][rows], raw[o][rows], f"{d}/{o} served raw")


def test_a_step_that_moves_test_calibration_away_from_1_is_flagged() -> None:
    rng = np.random.default_rng(6)
    p = rng.uniform(0.02, 0.2, 40_000)
    y = (rng.random(len(p)) < p).astype(np.float64)
    worse = calibration_shift(y, p, np.minimum(p * 1.3, 1.0))  # calibrated before, 30% over after
    assert worse["moved_away"] and worse["low"] > 0 and worse["after"] > 1.25
    better = calibration_shift(y, p * 1.3, p)
    assert not better["moved_away"] and better["high"] < 0
    # 42 positives: 1.22 -> 1.33 is within what the label total's noise allows
    few = np.zeros(4000)
    few[:42] = 1
    q = np.full(4000, 1.22 * 42 / 4000)
    small = calibration_shift(few, q, q * 1.33 / 1.22)
    assert small["distance_change"] > 0 and not small["moved_away"] and small["low"] < 0


def test_the_report_flags_a_constructed_worsening_cell(demo) -> None:
    frame = _frame(demo, 20_000, seed=7)
    cfg = demo
    before = {o: 1 / (1 + np.exp(-frame[f"z_{o}"].to_numpy(np.float64))) for o in cfg.objective_names}
    after = {o: before[o].copy() for o in cfg.objective_names}
    search = (frame["domain"] == "search").to_numpy()  # a calibrated cell pushed 40% over
    after["click"][search] = np.minimum(after["click"][search] * 1.4, 1.0)
    maps = C.fit_maps(cfg, frame, "platt", choice="validated")
    metrics = {"teacher": {"calibration": C.summary(maps, {}, C.effect(cfg, frame, before, after))}}
    assert metrics["teacher"]["calibration"]["test_moved_away"] == ["search/click"]
    table = calibration_table(metrics)
    assert table["teacher"]["moved_away"] == ["search/click"]
    assert table["teacher"]["cells"]["search/click"]["moved_away"] is True
    assert table["teacher"]["cells"]["feed/click"]["moved_away"] is False
    lines = calibration_lines(table)
    assert any(line.strip().startswith("FLAG search/click") for line in lines), lines
    from lattice.demo.report import calibration_rows, render_html

    report = {"models": {"teacher": metrics["teacher"]}}
    rows = {r[1]: r for r in calibration_rows(report)}
    assert rows["search/click"][7].startswith("FLAG") and rows["feed/click"][7] == "no"
    assert "FLAG: further from 1" in render_html(report)


def test_a_cell_the_gate_would_refuse_raw_keeps_its_map_without_an_ne_proof(demo) -> None:
    """Too few rows to show an NE gain, but the raw scores' calibration lies outside the gate's
    bounds beyond noise: the map stays (the gate would refuse the cell raw); inside them it goes."""
    from lattice.training.calibration import _outside_gate

    cfg = demo
    rng = np.random.default_rng(0)
    y = (rng.random(600) < 0.1).astype(float)  # 60 positives
    assert "outside promotion.calibration" in _outside_gate(cfg, y, np.full(600, 0.05))  # about 0.5
    assert _outside_gate(cfg, y, np.full(600, 0.1)) is None  # about 1
    assert _outside_gate(cfg, y, np.full(600, 0.075)) is None  # 0.75: outside, but within noise at 60 positives
