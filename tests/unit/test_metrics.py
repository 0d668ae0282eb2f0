"""NE, AUC and calibration against direct computations (scikit-learn and by hand)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import log_loss as sk_log_loss
from sklearn.metrics import roc_auc_score

from lattice.evaluation.metrics import auc, calibration, cell_metrics, ne, ne_from_sums


def _fixed(n: int = 2000, seed: int = 3):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.01, 0.6, n)
    y = (rng.uniform(size=n) < p).astype(float)
    return y, np.round(p, 2)  # rounding makes ties, which AUC must count half


def test_ne_matches_sklearn_log_loss_over_base_entropy() -> None:
    y, p = _fixed()
    r = y.mean()
    expected = sk_log_loss(y, p) / -(r * math.log(r) + (1 - r) * math.log(1 - r))
    assert ne(y, p) == pytest.approx(expected, rel=1e-9)
    # predicting the base rate everywhere is NE 1 by definition
    assert ne(y, np.full_like(p, r)) == pytest.approx(1.0, rel=1e-9)


def test_ne_from_sums_equals_ne() -> None:
    y, p = _fixed()
    ll = -(y * np.log(p) + (1 - y) * np.log(1 - p)).sum()
    assert ne_from_sums(ll, y.sum(), len(y)) == pytest.approx(ne(y, p), rel=1e-9)


def test_auc_matches_sklearn_with_ties() -> None:
    y, p = _fixed()
    assert auc(y, p) == pytest.approx(roc_auc_score(y, p), abs=1e-12)
    assert auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8])) == pytest.approx(0.75)


def test_degenerate_cells_are_nan_and_calibration() -> None:
    assert math.isnan(ne(np.zeros(5), np.full(5, 0.1)))
    assert math.isnan(auc(np.ones(5), np.full(5, 0.1)))
    assert calibration(np.array([1, 0, 0, 1]), np.array([0.5, 0.5, 0.25, 0.75])) == pytest.approx(1.0)


def test_cell_metrics_only_scores_labelled_rows(tmp_path) -> None:
    from pathlib import Path

    from lattice.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "demo.yaml")
    y, p = _fixed(900)
    df = pd.DataFrame({"domain": np.repeat(["feed", "search", "video"], 300)})
    for o in cfg.objective_names:
        df[f"label_{o}"], df[f"p_{o}"], df[f"truth_{o}"] = y, p, p
        df[f"mask_{o}"] = 1.0 if o == "click" else (df.domain != "video").astype(float)
    # garbage predictions on masked rows must not change anything
    df.loc[df.domain == "video", "p_conversion"] = 0.999
    m = cell_metrics(cfg, df)
    assert set(m["cells"]) == {"feed/click", "search/click", "video/click", "feed/conversion", "search/conversion"}
    feed = df.domain == "feed"
    assert m["cells"]["feed/conversion"]["ne"] == pytest.approx(ne(y[feed], p[feed]))
    assert m["cells"]["feed/click"]["oracle_ne"] == pytest.approx(m["cells"]["feed/click"]["ne"])
    assert m["macro"]["ne"] == pytest.approx(np.mean([c["ne"] for c in m["cells"].values()]))
