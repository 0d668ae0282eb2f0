"""Paired bootstrap comparison of two models scored on the same test rows: the per-cell and macro
NE difference (B - A) with a 95% interval, and whether it is within noise.

Both models are scored on one resample of the rows at a time, so the interval is that of the
difference itself: the row-to-row variation the two models share (hard rows are hard for both)
cancels, and a real gap far smaller than either model's own NE interval shows. Resampling is the
Poisson bootstrap: each row gets an independent Poisson(1) count per resample (multinomial
resampling's limit for many rows), so every cell is resampled within itself, and cells that share
rows (the objectives of one domain) share their counts, which the macro interval needs. Counts come
from a seeded generator through an inverse-CDF table and are applied as one matrix product per
block of rows, so 1M rows x 200 resamples take seconds.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pandas as pd

from lattice.config import PlatformConfig
from lattice.evaluation.metrics import EPS, entropy

RESAMPLES = 200
LEVEL = 0.95
BLOCK_ROWS = 1 << 15
_TABLE_BITS = 16


class RowsDiffer(ValueError):
    """The two prediction sets do not hold the same test rows: no paired comparison exists."""


def _poisson_table() -> np.ndarray:
    """Poisson(1) quantiles of 2^16 equally likely uniforms (tail beyond the table: < 1e-5)."""
    k = np.arange(16)
    cdf = np.cumsum(np.exp(-1.0) / np.array([math.factorial(int(i)) for i in k]))
    u = (np.arange(1 << _TABLE_BITS) + 0.5) / (1 << _TABLE_BITS)
    return np.searchsorted(cdf, u).astype(np.float32)


def aligned(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`a` and `b` on the same rows in the same order (b reordered to a's); RowsDiffer otherwise."""
    ia, ib = pd.Index(a["example_id"]), pd.Index(b["example_id"])
    for name, ids in (("A", ia), ("B", ib)):
        if not ids.is_unique:
            raise RowsDiffer(f"model {name}'s predictions repeat example ids: {int(ids.duplicated().sum())} rows")
    if len(ia) == len(ib) and np.array_equal(ia.to_numpy(), ib.to_numpy()):  # the usual case: both sorted by id
        return a.reset_index(drop=True), b.reset_index(drop=True)
    where = ib.get_indexer(ia)
    if len(ia) != len(ib) or (where < 0).any():
        only_a, only_b = ia.difference(ib), ib.difference(ia)
        raise RowsDiffer(f"the models were not scored on the same test rows: {len(only_a):,} rows only in A "
                         f"(e.g. {list(only_a[:3])}), {len(only_b):,} only in B (e.g. {list(only_b[:3])}); "
                         "compare models trained and tested on one table and split")
    return a.reset_index(drop=True), b.iloc[where].reset_index(drop=True)


def _row_loss(y: np.ndarray, p: np.ndarray) -> np.ndarray:
    q = np.clip(p.astype(np.float64), EPS, 1 - EPS)
    return -(y * np.log(q) + (1 - y) * np.log1p(-q))


def _columns(config: PlatformConfig, a: pd.DataFrame, b: pd.DataFrame) -> tuple[list[str], np.ndarray]:
    """Cells and the (rows, 3 x cells) matrix the resamples sum: per cell its rows' log-loss
    difference B - A, label and membership (0 outside the cell)."""
    domain = pd.Categorical(a["domain"], categories=config.domain_names).codes
    if not np.array_equal(domain, pd.Categorical(b["domain"], categories=config.domain_names).codes):
        raise RowsDiffer("the two prediction sets disagree on the rows' domains")
    cells, cols = [], []
    for o in config.objective_names:
        y, mask = a[f"label_{o}"].to_numpy(np.float64), a[f"mask_{o}"].to_numpy() > 0
        if not (np.array_equal(mask, b[f"mask_{o}"].to_numpy() > 0)
                and np.array_equal(y[mask], b[f"label_{o}"].to_numpy(np.float64)[mask])):
            raise RowsDiffer(f"objective {o}: the two prediction sets disagree on the rows' labels or masks")
        diff = _row_loss(y, b[f"p_{o}"].to_numpy()) - _row_loss(y, a[f"p_{o}"].to_numpy())
        for d, oo in config.cells():
            if oo == o:
                sel = mask & (domain == config.domain_names.index(d))
                cells.append(f"{d}/{o}")
                cols += [np.where(sel, diff, 0.0), np.where(sel, y, 0.0), sel.astype(np.float64)]
    order = [cells.index(f"{d}/{o}") for d, o in config.cells()]  # the config's cell order
    cols = [cols[3 * i + k] for i in order for k in range(3)]
    return [cells[i] for i in order], np.stack(cols, axis=1) if cols else np.zeros((len(a), 0))


def _ne_gap(sums: np.ndarray) -> np.ndarray:
    """(..., 3 x cells) sums -> (..., cells) NE differences; NaN where a resample of a cell has no
    positives or no negatives (its base-rate entropy is 0)."""
    s = sums.reshape(*sums.shape[:-1], -1, 3)
    d, y, n = s[..., 0], s[..., 1], s[..., 2]
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = y / n
        h = np.vectorize(entropy, otypes=[np.float64])(np.nan_to_num(rate))
        gap = (d / n) / h
    return np.where((y > 0) & (y < n), gap, np.nan)


def _verdict(lo: float, hi: float) -> str:
    if not (lo == lo and hi == hi):
        return "n/a"
    if lo <= 0 <= hi:
        return "within noise"
    return "B better" if hi < 0 else "A better"


def poisson_sums(m: np.ndarray, resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """(rows, k) per-row values -> (resamples, k) column sums of Poisson(1)-bootstrap resamples of
    the rows (one count per row and resample, shared by every column: the columns stay paired)."""
    table = _poisson_table()
    rng = np.random.default_rng(seed)
    sums = np.zeros((resamples, m.shape[1]))
    m32 = np.asarray(m, np.float32)  # float32 products within a block, float64 sums across blocks
    for start in range(0, len(m32), BLOCK_ROWS):
        block = m32[start:start + BLOCK_ROWS]
        counts = table[rng.integers(0, 1 << _TABLE_BITS, size=(resamples, len(block)), dtype=np.uint16)]
        sums += (counts @ block).astype(np.float64)
    return sums


def paired_bootstrap(config: PlatformConfig, a: pd.DataFrame, b: pd.DataFrame, resamples: int = RESAMPLES, seed: int = 0,
                     level: float = LEVEL) -> dict[str, Any]:
    """NE(B) - NE(A) per cell, per objective (mean over its cells) and macro (mean over every cell
    with an NE), each with a paired bootstrap `level` percentile interval. `a`, `b`: test predictions (example_id, domain, p_<o>, label_<o>,
    mask_<o>) of two models on the same rows (RowsDiffer otherwise). Negative: B is better."""
    a, b = aligned(a, b)
    cells, m = _columns(config, a, b)
    point = _ne_gap(m.sum(axis=0))
    gaps = _ne_gap(poisson_sums(m, resamples, seed))  # (resamples, cells)
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
    defined = ~np.isnan(point)
    out_cells = {}
    for i, cell in enumerate(cells):
        g = gaps[:, i]
        lo, hi = (float(x) for x in np.nanpercentile(g, q)) if defined[i] and np.isfinite(g).any() else (math.nan, math.nan)
        out_cells[cell] = {"ne_diff": float(point[i]), "low": lo, "high": hi, "verdict": _verdict(lo, hi),
                           "rows": int(m[:, 3 * i + 2].sum()), "positives": int(m[:, 3 * i + 1].sum())}
    def mean_of(columns: np.ndarray) -> dict[str, Any]:
        """The mean gap over the chosen cells that have an NE, with its interval from the same resamples."""
        use = columns & defined
        if not use.any():
            return {"ne_diff": math.nan, "low": math.nan, "high": math.nan, "verdict": "n/a"}
        with np.errstate(invalid="ignore"):
            per_resample = np.nanmean(gaps[:, use], axis=1)
        lo, hi = (float(x) for x in np.nanpercentile(per_resample, q))
        return {"ne_diff": float(point[use].mean()), "low": lo, "high": hi, "verdict": _verdict(lo, hi)}

    objective = np.array([c.split("/", 1)[1] for c in cells])
    # per objective: the goal ("the teacher's macro NE on every objective") is judged objective by objective
    by_objective = {o: mean_of(objective == o) for o in config.objective_names}
    return {"rows": int(len(a)), "resamples": int(resamples), "level": level, "seed": int(seed), "cells": out_cells,
            "by_objective": by_objective, "macro": mean_of(np.ones(len(cells), bool))}


def compare_models(config: PlatformConfig, predictions: dict[str, pd.DataFrame], resamples: int = RESAMPLES,
                   seed: int = 0) -> list[dict[str, Any]]:
    """Every pair (A, B) of `predictions` (model -> test predictions) in the given order, A first:
    B - A per cell and macro, or the reason the pair cannot be compared."""
    out = []
    for name_a, name_b in itertools.combinations(predictions, 2):
        entry: dict[str, Any] = {"a": name_a, "b": name_b}
        try:
            entry.update(paired_bootstrap(config, predictions[name_a], predictions[name_b], resamples, seed))
        except RowsDiffer as exc:
            entry["error"] = str(exc)
        except KeyError as exc:  # trained under configs with other objectives or columns
            entry["error"] = f"the prediction sets do not share column {exc}"
        out.append(entry)
    return out
