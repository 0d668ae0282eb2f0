"""NE, AUC and calibration, per (domain, objective) cell and as macro means.

NE (normalized entropy) = mean log loss / entropy of the cell's base rate: 1.0 is no better than
predicting the base rate, lower is better. Calibration = sum of predictions / sum of labels.
The oracle NE scores the generator's true probabilities (synthetic data only).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from lattice.config import PlatformConfig

EPS = 1e-7


def log_loss(y: np.ndarray, p: np.ndarray) -> float:
    p = np.clip(np.asarray(p, np.float64), EPS, 1 - EPS)
    y = np.asarray(y, np.float64)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def entropy(rate: float) -> float:
    r = min(max(rate, EPS), 1 - EPS)
    return -(r * math.log(r) + (1 - r) * math.log(1 - r))


def ne(y: np.ndarray, p: np.ndarray) -> float:
    y = np.asarray(y, np.float64)
    if len(y) == 0 or y.min() == y.max():
        return float("nan")  # no positives (or no negatives): the base-rate entropy is 0
    return log_loss(y, p) / entropy(float(y.mean()))


def ne_from_sums(sum_logloss: float, sum_y: float, count: float) -> float:
    """NE from sufficient statistics (what ranks all-reduce during validation)."""
    if count <= 0 or sum_y <= 0 or sum_y >= count:
        return float("nan")
    return (sum_logloss / count) / entropy(sum_y / count)


def ne_standard_error(y: np.ndarray, p: np.ndarray) -> float:
    """Standard error of the NE from the per-row log-loss gain over the base rate (NE - 1 is its
    mean over the entropy), so a gate can tell "worse than the base rate" from noise."""
    y = np.asarray(y, np.float64)
    n = len(y)
    if n < 2 or y.min() == y.max():
        return float("nan")
    q = np.clip(np.asarray(p, np.float64), EPS, 1 - EPS)
    r = float(y.mean())
    d = -(y * np.log(q) + (1 - y) * np.log(1 - q)) + (y * math.log(r) + (1 - y) * math.log(1 - r))
    return float(d.std(ddof=1) / math.sqrt(n) / entropy(r))


def paired_ne_ratio(y: np.ndarray, p_a: np.ndarray, p_b: np.ndarray) -> tuple[float, float]:
    """NE of model a over NE of model b on the same rows, and the standard error of that ratio.

    Both NEs share the cell's base-rate entropy, so the ratio is mean log loss a / mean log loss b;
    its error comes from the per-row differences (delta method on a ratio of paired means), which
    is far smaller than either NE's own error: two models scored on the same rows share most of
    their noise. (NaN, NaN) when the cell has no positives or fewer than two rows."""
    y = np.asarray(y, np.float64)
    n = len(y)
    if n < 2 or y.min() == y.max():
        return float("nan"), float("nan")

    def losses(p):
        q = np.clip(np.asarray(p, np.float64), EPS, 1 - EPS)
        return -(y * np.log(q) + (1 - y) * np.log(1 - q))

    la, lb = losses(p_a), losses(p_b)
    mb = float(lb.mean())
    if mb <= 0:
        return float("nan"), float("nan")
    ratio = float(la.mean()) / mb
    d = la - ratio * lb
    return ratio, float(d.std(ddof=1) / math.sqrt(n) / mb)


def auc(y: np.ndarray, p: np.ndarray) -> float:
    """Probability a random positive outranks a random negative (ties count half):
    the Mann-Whitney U statistic from average ranks."""
    y = np.asarray(y, bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = pd.Series(np.asarray(p, np.float64)).rank(method="average").to_numpy()
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def calibration(y: np.ndarray, p: np.ndarray) -> float:
    s = float(np.sum(y))
    return float(np.sum(p)) / s if s > 0 else float("nan")


def calibration_interval(calibration: float, expected: float, positives: float, variance: float,
                         z: float) -> tuple[float, float]:
    """(low, high) of sum p / sum y when the positive count may be off by z standard deviations
    (normal approximation of a sum of Bernoullis under the model: mean `expected` = sum p,
    variance `variance` = sum p(1 - p)). Unknown sums or z <= 0: the point estimate twice."""
    if not positives or expected != expected or variance != variance or z <= 0:
        return calibration, calibration
    half = z * math.sqrt(max(variance, 0.0))
    low = expected / (positives + half)
    high = expected / (positives - half) if positives > half else math.inf
    return low, high


def expected_calibration_error(y: np.ndarray, p: np.ndarray, bins: int = 10) -> float:
    """Mean |mean prediction - observed rate| over `bins` equal-mass bins of the predictions,
    weighted by rows: the miscalibration the ratio above hides when errors of opposite sign
    cancel (over-predicting the top bins, under-predicting the bottom ones)."""
    y, p = np.asarray(y, np.float64), np.asarray(p, np.float64)
    if len(y) == 0:
        return float("nan")
    order = np.argsort(p, kind="stable")
    ids = np.arange(len(y)) * min(bins, len(y)) // len(y)
    count = np.bincount(ids)
    gap = np.abs(np.bincount(ids, p[order]) - np.bincount(ids, y[order]))
    return float(gap.sum() / count.sum())


def _nanmean(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return float(np.mean(xs)) if xs else float("nan")


def cell_metrics(config: PlatformConfig, df: pd.DataFrame, prob_prefix: str = "p_") -> dict:
    """df: example rows with domain, label_<o>, mask_<o>, <prob_prefix><o> and optionally truth_<o>."""
    cells: dict[str, dict] = {}
    for d, o in config.cells():
        sel = (df["domain"] == d) & (df[f"mask_{o}"] > 0)
        y = df.loc[sel, f"label_{o}"].to_numpy(np.float64)
        p = df.loc[sel, f"{prob_prefix}{o}"].to_numpy(np.float64)
        c = {"n": int(len(y)), "positives": int(y.sum()), "ne": ne(y, p), "auc": auc(y, p), "calibration": calibration(y, p),
             "ece": expected_calibration_error(y, p), "log_loss": log_loss(y, p) if len(y) else float("nan"),
             # sum p and sum p(1-p): the mean and variance of the positive count if the model were
             # calibrated, which the gate's calibration interval needs (lattice.promotion.gate)
             "expected_positives": float(p.sum()), "positives_variance": float((p * (1 - p)).sum()),
             "ne_se": ne_standard_error(y, p)}
        tcol = f"truth_{o}"
        if tcol in df and df.loc[sel, tcol].notna().all() and len(y):
            t = df.loc[sel, tcol].to_numpy(np.float64)
            c["oracle_ne"] = ne(y, t)
            c["oracle_auc"] = auc(y, t)
        cells[f"{d}/{o}"] = c
    macro = {k: _nanmean([c.get(k, float("nan")) for c in cells.values()]) for k in ("ne", "auc", "calibration", "oracle_ne")}
    by_objective = {
        o: {k: _nanmean([c.get(k, float("nan")) for key, c in cells.items() if key.endswith(f"/{o}")]) for k in ("ne", "auc", "oracle_ne")}
        for o in config.objective_names
    }
    return {"cells": cells, "macro": macro, "by_objective": by_objective}
