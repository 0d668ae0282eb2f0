"""Per (domain, objective, model version, period) figures of the joined log, and the population
stability index of dense features against the training window.

Only rows whose label is known (joined, mask 1) enter NE, AUC, calibration and the label rate;
`logged` and `pending` say how many predictions the cell served and how many still wait for
their label, so a young period with few labels reads as young, not as good or bad."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lattice.config import PlatformConfig
from lattice.data import schema as S
from lattice.evaluation import metrics as M
from lattice.monitoring.records import feature_column

PERIOD_FREQ = {"hour": "h", "day": "D"}
PSI_BINS = 10
PSI_EPS = 1e-4  # floor of a bin's share: an empty bin on one side adds a large but finite term


def add_period(frame: pd.DataFrame, period: str) -> pd.DataFrame:
    """`period` (the period's start, UTC, as text) from `logged_at`."""
    start = frame["logged_at"].dt.tz_convert("UTC").dt.floor(PERIOD_FREQ[period])
    fmt = "%Y-%m-%dT%H:00Z" if period == "hour" else "%Y-%m-%d"
    return frame.assign(period=start.dt.strftime(fmt), period_start=start)


def cell_table(config: PlatformConfig, joined: pd.DataFrame) -> pd.DataFrame:
    """One row per (domain, objective, model_version, period) that served predictions."""
    rows = []
    if joined.empty:
        return pd.DataFrame(rows)
    version = joined["model_version"].astype("Int64").fillna(-1)  # -1: scored by an unregistered model
    groups = joined.assign(model_version=version).groupby(["domain", "model_version", "period"], sort=True)
    for (domain, ver, period), g in groups:
        unknown_rate = float((g["unknown_entities"].fillna("") != "").mean())
        store_error_rate = float(g["store_error"].fillna(False).astype(bool).mean()) if "store_error" in g else 0.0
        for obj in config.objectives:
            if domain not in obj.domains:
                continue
            known = g[S.mask_column(obj.name)].to_numpy() == 1
            y = g[S.label_column(obj.name)].to_numpy(np.float64)[known]
            p = g[f"p_{obj.name}"].to_numpy(np.float64)[known]
            pos = float(y.sum())
            rows.append({
                "domain": domain, "objective": obj.name, "model_version": int(ver), "period": period,
                "period_start": g["period_start"].iloc[0],
                "logged": int(len(g)), "count": int(known.sum()), "pending": int((~g["joined"]).sum()),
                "positives": int(pos),
                "label_rate": float(y.mean()) if len(y) else float("nan"),
                "prediction_mean": float(p.mean()) if len(p) else float("nan"),
                "calibration": M.calibration(y, p),
                # sum p and sum p(1-p): the positive count's mean and variance were the model
                # calibrated; the calibration rule's interval needs them (monitoring.rules)
                "expected_positives": float(p.sum()), "positives_variance": float((p * (1 - p)).sum()),
                "ne": M.ne(y, p), "auc": M.auc(y, p),
                "unknown_entity_rate": unknown_rate, "store_error_rate": store_error_rate,
            })
    return pd.DataFrame(rows)


def _edges(reference: np.ndarray) -> np.ndarray:
    """Inner bin edges: the reference's deciles (repeated values collapse, so a feature with few
    distinct values gets fewer bins)."""
    qs = np.quantile(reference, np.linspace(0, 1, PSI_BINS + 1)[1:-1])
    return np.unique(qs)


def _shares(values: np.ndarray, edges: np.ndarray, missing: int) -> np.ndarray:
    """Share of rows per bin, plus a last bin for values that were not sent."""
    counts = np.bincount(np.searchsorted(edges, values, side="right"), minlength=len(edges) + 1).astype(np.float64)
    counts = np.append(counts, missing)
    total = counts.sum()
    return counts / total if total else counts


def psi(reference: np.ndarray, current: np.ndarray) -> float:
    """Population stability index of `current` against `reference` (NaN = not sent, its own bin):
    sum over bins of (a - e) * ln(a / e)."""
    ref, cur = np.asarray(reference, np.float64), np.asarray(current, np.float64)
    if len(ref) == 0 or len(cur) == 0:
        return float("nan")
    ref_ok, cur_ok = ref[~np.isnan(ref)], cur[~np.isnan(cur)]
    edges = _edges(ref_ok) if len(ref_ok) else np.array([])
    e = np.maximum(_shares(ref_ok, edges, len(ref) - len(ref_ok)), PSI_EPS)
    a = np.maximum(_shares(cur_ok, edges, len(cur) - len(cur_ok)), PSI_EPS)
    return float(np.sum((a - e) * np.log(a / e)))


def reference_values(config: PlatformConfig, training: pd.DataFrame) -> dict[tuple[str, str], np.ndarray]:
    """(domain, dense column) -> the training window's values (NaN where the row did not carry it)."""
    out = {}
    for domain, g in training.groupby("domain"):
        for c in S.dense_columns(config):
            if c not in g:
                continue
            v = g[c].to_numpy(np.float64).copy()
            flag = S.present_column(c)
            if flag in g:
                v[g[flag].to_numpy() == 0] = np.nan
            out[(str(domain), c)] = v
    return out


def drift_table(config: PlatformConfig, log: pd.DataFrame, reference: dict[tuple[str, str], np.ndarray]) -> pd.DataFrame:
    """One row per (domain, dense feature, period): PSI against the training window."""
    rows = []
    if log.empty:
        return pd.DataFrame(rows)
    for (domain, period), g in log.groupby(["domain", "period"], sort=True):
        version = g["model_version"].dropna()
        for c in S.dense_columns(config):
            col = feature_column(c)
            ref = reference.get((str(domain), c))
            if col not in g or ref is None:
                continue
            cur = g[col].to_numpy(np.float64)
            rows.append({"domain": domain, "feature": c, "period": period, "period_start": g["period_start"].iloc[0],
                         "model_version": int(version.max()) if len(version) else -1,
                         "psi": psi(ref, cur), "rows": int(len(cur)), "reference_rows": int(len(ref))})
    return pd.DataFrame(rows)
