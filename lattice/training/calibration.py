"""Fit the calibration stage (`lattice.models.calibrated`) on the validation split: one monotone
map logit -> logit per (domain, objective) cell, and measure its effect per cell.

Methods (`training.calibration`):
  - `platt`: s = a z + b by logistic regression on the raw logit z, with Gaussian priors that
    pull the slope and the level toward the identity (worth about `PLATT_PRIOR` and
    `PLATT_LEVEL_PRIOR` positives, so a small cell barely moves and a large one is fitted by its
    data); the slope is kept >= `MIN_SLOPE`.
  - `isotonic`: sklearn's pool-adjacent-violators on z gives the blocks; each block's rate is
    smoothed toward the cell's base rate (one pseudo-example of the rarer class: an all-negative
    block never maps to probability 0), blocks are pooled again until the rates rise strictly, one
    common logit shift restores the cell's total, and the map is flat across each block and
    linear across the gaps between blocks (sklearn's interpolation). Beyond the lowest / highest
    validation logit it continues with the Platt slope, so the extremes keep their order.
  - `histogram`: the same with equal-mass bins of about `POSITIVES_PER_BIN` positives each in
    place of the isotonic blocks.
A cell with fewer than `min_positives` validation positives gets Platt (the two-parameter map that
small data supports), one with no positives or no negatives the identity.

The map is then chosen, not imposed (`training.calibration_choice: validated`, the default): each
cell keeps its map only where it improves validation NE beyond noise, judged out of fold. The
cell's validation rows are dealt into two folds at random (seeded), stratified by label so both
halves hold the cell's rate and a half's map is not judged on the halves' chance difference; the
map fitted on one fold scores the other, so every row gets a calibrated logit from a map that
never saw its label. The paired bootstrap (lattice.evaluation.compare) of NE(cross-fitted) -
NE(raw) on the cell's rows gives an interval (`CHOICE_LEVEL`); the map stays when the whole
interval is below 0 (it helps with 90% one-sided confidence) and is otherwise replaced by the
identity (the cell scores uncalibrated everywhere: eager, exported, served). One exception: a cell
whose raw validation calibration lies outside `promotion.calibration` beyond noise (the gate's own
interval) keeps its map even when its rows are too few to show an NE gain, since the gate would
refuse the cell without it (a one-day window of a small log: 33 positives, raw calibration 0.54).
Judging on the rows
the map was fitted on instead is optimistic (bench/bench_calibration_choice.py measures both).
The map kept is the one fitted on all the validation rows. Each cell records the decision and its
figures under `choice`; a dropped cell's fitted map stays under `candidate`, and its own knots are
the identity's, so a reader of the maps written before this step existed (which applies every
cell's knots) also scores it raw.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pandas as pd
import torch

from lattice.config import PlatformConfig
from lattice.evaluation.metrics import auc, calibration, expected_calibration_error, ne

METHODS = ("none", "platt", "isotonic", "histogram")
CHOICES = ("validated", "always")
MAPS_VERSION = 2
"""1 (no `version` key): every cell's knots applied. 2: cells carry `choice`; a dropped cell's
knots are the identity's and its fitted map is under `candidate` (both versions load alike)."""
CHOICE_FOLDS = 2
CHOICE_RESAMPLES = 400
"""Bootstrap resamples of the choice: the rule reads the interval's upper end (the 90th percentile)."""
CHOICE_LEVEL = 0.8
"""Two-sided level of the paired interval whose upper end must lie below 0 for a map to stay: the
cross-fitted NE change is below 0 with 90% one-sided confidence. Measured with
bench/bench_calibration_choice.py (levels 0.95 / 0.9 / 0.8 / 0.6 / point, chosen on the demo and
Taobao, confirmed on Avazu and Criteo; docs/bench/calibration.md): 0.95 dropped 16 of 18 Taobao
maps, most of which helped on test (macro test NE 0.9014 against 0.8978 always applied); 0.8
keeps the maps that clearly help (0.8993) and, like every level, moved no cell's test
calibration away from 1 beyond noise, where always applying moved one."""
MAX_KNOTS = 256
"""Knots per cell at most (two per block; adjacent blocks are merged by mass beyond it): the
artifact's lookup reads (batch, knots) values per objective."""
POSITIVES_PER_BIN = 50
PLATT_PRIOR = 30.0
"""Prior weight pulling Platt's slope toward 1 (about that many positives' worth)."""
PLATT_LEVEL_PRIOR = 10.0
"""Prior weight pulling Platt's level (the shift at the cell's mean logit) toward 0. The pull on
the validation total is this weight times the shift, so it also bounds how far a large cell stays
from calibrated. Both were measured on the synthetic 1M, demo 150k, Taobao and Avazu samples
(bench/calibration_methods.py, test NE): slope 30 / level 10 is within 0.0008 of the best pair
tried on every set (0 / 3 / 10 / 30 each) and leaves cells of 200+ validation positives within
0.7% of calibrated on validation; level 30 gains up to 0.0008 NE on the small sets but leaves 2%."""
MIN_SLOPE = 0.05
RATE_EPS = 1e-6


def _logit(p: np.ndarray | float) -> np.ndarray:
    p = np.clip(np.asarray(p, np.float64), RATE_EPS, 1 - RATE_EPS)
    return np.log(p) - np.log1p(-p)


def _sigmoid(s: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + np.tanh(0.5 * s))  # no overflow warnings at large |s|


def fit_platt(z: np.ndarray, y: np.ndarray, prior: float | None = None, level_prior: float | None = None) -> tuple[float, float]:
    """(slope, intercept) of s = slope * z + intercept: penalised logistic regression (Newton's
    method) in the centred form s = z + alpha (z - mean z) + c, with penalty
    (prior alpha^2 + level_prior c^2) / 2 (defaults `PLATT_PRIOR`, `PLATT_LEVEL_PRIOR`)."""
    prior = PLATT_PRIOR if prior is None else prior
    level_prior = PLATT_LEVEL_PRIOR if level_prior is None else level_prior
    weights = np.array([prior, level_prior])
    z, y = np.asarray(z, np.float64), np.asarray(y, np.float64)
    zbar = float(z.mean())
    u = z - zbar
    theta = np.zeros(2)  # alpha, c: the identity

    def loss(t: np.ndarray) -> float:
        s = z + t[0] * u + t[1]
        return float(np.sum(np.logaddexp(0.0, s) - y * s) + 0.5 * float(weights @ (t * t)))

    current = loss(theta)
    for _ in range(100):
        p = _sigmoid(z + theta[0] * u + theta[1])
        w = p * (1 - p)
        g = np.array([np.sum((p - y) * u), np.sum(p - y)]) + weights * theta
        h = np.array([[np.sum(w * u * u), np.sum(w * u)], [np.sum(w * u), np.sum(w)]]) + np.diag(weights)
        step = np.linalg.solve(h, g)
        scale = 1.0
        while scale > 1e-6:  # damped: the loss is convex, but a full step can overshoot far out
            cand = theta - scale * step
            value = loss(cand)
            if value <= current:
                break
            scale /= 2
        theta, moved, current = cand, float(np.max(np.abs(scale * step))), value
        if moved < 1e-10:
            break
    alpha, c = float(theta[0]), float(theta[1])
    if 1 + alpha < MIN_SLOPE:  # an anti-ranking cell: keep the order, fit only the level
        alpha = MIN_SLOPE - 1
        base = z + alpha * u
        for _ in range(100):
            p = _sigmoid(base + c)
            step = (np.sum(p - y) + level_prior * c) / (np.sum(p * (1 - p)) + level_prior)
            c -= step
            if abs(step) < 1e-10:
                break
    return 1 + alpha, c - alpha * zbar


def _groups(pos: np.ndarray, n: np.ndarray, lo: np.ndarray, hi: np.ndarray, pseudo: float, rate: float) -> np.ndarray:
    """Consecutive blocks (positives, rows, lowest z, highest z) pooled until their smoothed rates
    (positives + pseudo * rate) / (rows + pseudo) rise strictly (pool-adjacent-violators):
    (groups, 4)."""

    def value(g: list[float]) -> float:
        return (g[0] + pseudo * rate) / (g[1] + pseudo)

    out: list[list[float]] = []
    for block in zip(pos.tolist(), n.tolist(), lo.tolist(), hi.tolist()):
        out.append(list(block))
        while len(out) > 1 and value(out[-2]) >= value(out[-1]):
            last = out.pop()
            out[-1] = [out[-1][0] + last[0], out[-1][1] + last[1], out[-1][2], last[3]]
    return np.array(out, np.float64).reshape(-1, 4)


def _level(v: np.ndarray, n: np.ndarray, positives: float) -> np.ndarray:
    """Block logits `v` shifted by one common amount so that their rows' predictions sum to the
    cell's positives: the smoothing pulls small blocks toward the base rate, and small blocks
    sit mostly at the top, so without it the cell would end up under-predicted."""
    shift = 0.0
    for _ in range(50):
        p = _sigmoid(v + shift)
        step = (float(n @ p) - positives) / max(float(n @ (p * (1 - p))), 1e-12)
        shift -= step
        if abs(step) < 1e-10:
            break
    return v + shift


def _block_ids(z_sorted: np.ndarray, y_sorted: np.ndarray, method: str, positives: int) -> np.ndarray:
    """Block index per row (rows sorted by z; tied logits always share a block)."""
    if method == "isotonic":
        from sklearn.isotonic import IsotonicRegression

        fitted = IsotonicRegression(increasing=True, out_of_bounds="clip").fit_transform(z_sorted, y_sorted)
        return np.concatenate([[0], np.cumsum(np.diff(fitted) != 0)])
    bins = int(min(MAX_KNOTS // 2, max(2, positives // POSITIVES_PER_BIN)))
    by_rank = np.arange(len(z_sorted)) * bins // len(z_sorted)
    _, first, inverse = np.unique(z_sorted, return_index=True, return_inverse=True)
    return by_rank[first[inverse]]


def _nonparametric(z: np.ndarray, y: np.ndarray, method: str, slope: float) -> dict[str, Any] | None:
    """A block map: flat at each block's smoothed rate from its lowest to its highest validation
    logit, linear across the gap to the next block (sklearn's isotonic interpolation), so every
    validation row gets exactly its block's rate."""
    order = np.argsort(z, kind="stable")
    zs, ys = z[order], y[order]
    ids = _block_ids(zs, ys, method, int(ys.sum()))
    starts = np.flatnonzero(np.concatenate([[True], np.diff(ids) != 0]))
    ends = np.concatenate([starts[1:], [len(zs)]]) - 1
    pos, n = np.add.reduceat(ys, starts), (ends - starts + 1).astype(np.float64)
    rate = float(ys.mean())
    pseudo = 1.0 / min(rate, 1 - rate)  # one pseudo-example of the rarer class at the base rate
    g = _groups(pos, n, zs[starts], zs[ends], pseudo, rate)
    if len(g) > MAX_KNOTS // 2:  # two knots a group: merge by mass, then restore strict order
        cut = np.minimum((np.cumsum(g[:, 1]) - g[:, 1] / 2) * (MAX_KNOTS // 2) // g[:, 1].sum(), MAX_KNOTS // 2 - 1)
        first = np.flatnonzero(np.concatenate([[True], np.diff(cut) != 0]))
        last = np.concatenate([first[1:], [len(g)]]) - 1
        g = _groups(np.add.reduceat(g[:, 0], first), np.add.reduceat(g[:, 1], first), g[first, 2], g[last, 3], pseudo, rate)
    if len(g) < 2:
        return None
    v = _level(_logit((g[:, 0] + pseudo * rate) / (g[:, 1] + pseudo)), g[:, 1], float(g[:, 0].sum()))
    x = np.stack([g[:, 2], g[:, 3]], axis=1).ravel().astype(np.float32)
    yv = np.repeat(v, 2).astype(np.float32)
    strict = np.concatenate([[True], np.diff(x) > 0])  # one-value blocks (and float32 ties) keep one knot
    return {"x": x[strict].tolist(), "y": np.maximum.accumulate(yv[strict]).tolist(), "lo": slope, "hi": slope}


def fit_cell(z: np.ndarray, y: np.ndarray, method: str, min_positives: int = 0) -> dict[str, Any]:
    """The map of one cell from its validation logits `z` and labels `y` (json-able)."""
    z, y = np.asarray(z, np.float64), np.asarray(y, np.float64)
    n, positives = int(len(y)), int(y.sum())
    info = {"n": n, "positives": positives}
    if method not in METHODS or method == "none":
        raise ValueError(f"unknown calibration method {method!r}; use one of {METHODS[1:]}")
    if positives == 0 or positives == n:
        return {"method": "identity", "x": [-1.0, 1.0], "y": [-1.0, 1.0], "lo": 1.0, "hi": 1.0, **info}
    slope, intercept = fit_platt(z, y)
    if method != "platt" and positives >= min_positives:
        fitted = _nonparametric(z, y, method, slope)
        if fitted is not None:
            return {"method": method, **fitted, **info}
    lo_z, hi_z = float(z.min()), float(z.max())
    if hi_z - lo_z < 1e-3:
        lo_z, hi_z = lo_z - 1, hi_z + 1
    xs = np.array([lo_z, hi_z], np.float32)
    return {"method": "platt", "x": xs.tolist(), "y": (slope * xs.astype(np.float64) + intercept).astype(np.float32).tolist(),
            "lo": slope, "hi": slope, "slope": slope, "intercept": intercept, **info}


def apply_cell(cell: dict[str, Any], z: np.ndarray) -> np.ndarray:
    """One cell's map on raw logits `z` in numpy: the function `models.calibrated.piecewise` computes
    (linear between knots, the tail slopes beyond them), for choosing without building a module."""
    z = np.asarray(z, np.float64)
    x, y = np.asarray(cell["x"], np.float64), np.asarray(cell["y"], np.float64)
    out = np.interp(z, x, y)
    out = np.where(z < x[0], y[0] + (z - x[0]) * float(cell["lo"]), out)
    return np.where(z > x[-1], y[-1] + (z - x[-1]) * float(cell["hi"]), out)


def _cells(config: PlatformConfig, frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """cell -> boolean row selection of `frame` (its domain's rows where the objective is labelled)."""
    return {f"{d}/{o}": ((frame["domain"] == d) & (frame[f"mask_{o}"] > 0)).to_numpy() for d, o in config.cells()}


def _stratified_folds(y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A fold per row, at random but with the positives (and the negatives) dealt out evenly: an
    unstratified split of a cell with 300 positives put 180 in one half and 121 in the other
    (Taobao), and the level a half's map learns then misses the other half's rate by the two
    halves' own difference, noise that the map fitted on every row does not have."""
    fold = np.empty(len(y), np.int64)
    for value in (0, 1):
        rows = np.flatnonzero((y > 0.5) == bool(value))
        start = int(rng.integers(CHOICE_FOLDS))  # which fold gets an odd class's extra row
        fold[rows[rng.permutation(len(rows))]] = (np.arange(len(rows)) + start) % CHOICE_FOLDS
    return fold


def judged_logits(config: PlatformConfig, frame: pd.DataFrame, maps: dict[str, Any], method: str, min_positives: int,
                  judge: str = "crossfit", seed: int = 0) -> dict[str, np.ndarray]:
    """objective -> the logits the choice judges each validation row by. `crossfit`: the row's
    cell's map fitted on the other fold (`CHOICE_FOLDS` random folds per cell); `insample`: the
    map of `maps` (fitted on every row, its own included: optimistic, kept to measure how much)."""
    out = {o: frame[f"z_{o}"].to_numpy(np.float64).copy() for o in config.objective_names}
    rng = np.random.default_rng(seed)
    for cell, sel in _cells(config, frame).items():
        o = cell.split("/", 1)[1]
        rows = np.flatnonzero(sel)
        z, y = out[o][rows], frame[f"label_{o}"].to_numpy(np.float64)[rows]
        if judge == "insample":
            out[o][rows] = apply_cell(maps["cells"][cell], z)
            continue
        if judge != "crossfit":
            raise ValueError(f"unknown judge {judge!r}; use crossfit or insample")
        fold = _stratified_folds(y, rng)
        for k in range(CHOICE_FOLDS):
            fit, held = fold != k, fold == k
            if held.any() and fit.any():
                out[o][rows[held]] = apply_cell(fit_cell(z[fit], y[fit], method, min_positives), z[held])
    return out


def choose(config: PlatformConfig, frame: pd.DataFrame, maps: dict[str, Any], method: str, min_positives: int,
           judge: str = "crossfit", seed: int = 0, level: float = CHOICE_LEVEL) -> dict[str, dict[str, Any]]:
    """cell -> the decision on its map: kept (validation NE better beyond noise, judged by
    `judge`) or dropped, validation NE before / after, the paired interval and the reason."""
    from lattice.evaluation.compare import paired_bootstrap

    judged = judged_logits(config, frame, maps, method, min_positives, judge, seed)
    base = frame[["example_id", "domain"] + [f"{k}_{o}" for o in config.objective_names for k in ("label", "mask")]]
    raw = base.assign(**{f"p_{o}": _sigmoid(frame[f"z_{o}"].to_numpy(np.float64)) for o in config.objective_names})
    cal = base.assign(**{f"p_{o}": _sigmoid(judged[o]) for o in config.objective_names})
    with warnings.catch_warnings():  # the macro mean of resamples where a tiny cell has no NE: unused here
        warnings.simplefilter("ignore", RuntimeWarning)
        gaps = paired_bootstrap(config, raw, cal, resamples=CHOICE_RESAMPLES, seed=seed, level=level)["cells"]
    out = {}
    for cell, sel in _cells(config, frame).items():
        o = cell.split("/", 1)[1]
        y = frame.loc[sel, f"label_{o}"].to_numpy(np.float64)
        g = gaps[cell]
        entry = {"judge": judge, "level": level, "val_ne_before": ne(y, raw.loc[sel, f"p_{o}"].to_numpy()),
                 "val_ne_after": ne(y, cal.loc[sel, f"p_{o}"].to_numpy()), "ne_diff": g["ne_diff"], "low": g["low"],
                 "high": g["high"]}
        fitted = maps["cells"][cell]["method"]
        refused = _outside_gate(config, y, raw.loc[sel, f"p_{o}"].to_numpy(np.float64))
        if fitted == "identity":
            entry.update(kept=True, reason="no positives or no negatives on validation: the identity")
        elif refused:
            # too few rows to show an NE gain, but raw the cell would fail the promotion gate's
            # calibration check by its own rule: the map is what makes the cell servable
            entry.update(kept=True, reason=refused)
        elif g["high"] == g["high"] and g["high"] < 0:
            entry.update(kept=True, reason=f"{judge} validation NE {g['ne_diff']:+.4f}, {level:.0%} interval "
                                           f"[{g['low']:+.4f}, {g['high']:+.4f}] below 0")
        else:
            entry.update(kept=False, reason=f"{judge} validation NE {g['ne_diff']:+.4f}, {level:.0%} interval "
                                            f"[{g['low']:+.4f}, {g['high']:+.4f}] not below 0: within noise or worse")
        out[cell] = entry
    return out


def _outside_gate(config: PlatformConfig, y: np.ndarray, p: np.ndarray) -> str | None:
    """Why the raw scores' validation calibration (sum p / sum y) lies outside the promotion gate's
    `calibration` bounds beyond noise, by the gate's own interval; None when it does not."""
    from statistics import NormalDist

    from lattice.promotion.gate import CellMetrics

    positives = int(y.sum())
    if positives == 0 or len(y) == 0:
        return None
    expected = float(p.sum())
    m = CellMetrics(ne=float("nan"), auc=float("nan"), calibration=expected / positives, count=len(y),
                    positives=positives, expected=expected, variance=float((p * (1 - p)).sum()))
    gate = config.promotion
    z = NormalDist().inv_cdf(0.5 + gate.calibration_confidence / 2) if gate.calibration_confidence > 0 else 0.0
    lo, hi = m.calibration_interval(z)
    if hi < gate.calibration[0] or lo > gate.calibration[1]:
        return (f"raw validation calibration {m.calibration:.3f} ({100 * gate.calibration_confidence:g}% interval "
                f"[{lo:.3f}, {hi:.3f}]) outside promotion.calibration {list(gate.calibration)}: kept, the gate would "
                "refuse the cell without it")
    return None


def fit_maps(config: PlatformConfig, frame: pd.DataFrame, method: str, min_positives: int = 0, choice: str | None = None,
             judge: str = "crossfit", seed: int = 0, level: float = CHOICE_LEVEL) -> dict[str, Any]:
    """Maps for every cell from validation rows: `frame` has domain, z_<o> (raw logits),
    label_<o>, mask_<o> (and example_id). What `lattice.models.calibrated.CellCalibration` takes.
    `choice` (default `training.calibration_choice`): `validated` keeps a cell's map only where it
    improves validation NE beyond noise (see the module docstring), `always` keeps every map."""
    choice = choice or config.training.calibration_choice
    if choice not in CHOICES:
        raise ValueError(f"unknown calibration choice {choice!r}; use one of {CHOICES}")
    cells = {}
    for cell, sel in _cells(config, frame).items():
        o = cell.split("/", 1)[1]
        cells[cell] = fit_cell(frame.loc[sel, f"z_{o}"].to_numpy(), frame.loc[sel, f"label_{o}"].to_numpy(), method,
                               min_positives)
    maps = {"version": MAPS_VERSION, "method": method, "min_positives": int(min_positives), "choice": choice,
            "domains": list(config.domain_names), "objectives": list(config.objective_names), "cells": cells}
    if choice == "validated":
        for cell, decision in choose(config, frame, maps, method, min_positives, judge, seed, level).items():
            fitted = cells[cell]
            if decision["kept"]:
                cells[cell] = {**fitted, "choice": decision}
            else:  # the identity's knots: every reader of the maps, old or new, scores this cell raw
                cells[cell] = {"method": "none", "x": [-1.0, 1.0], "y": [-1.0, 1.0], "lo": 1.0, "hi": 1.0,
                               "n": fitted["n"], "positives": fitted["positives"], "choice": decision,
                               "candidate": {k: v for k, v in fitted.items() if k not in ("n", "positives")}}
    return maps


@torch.no_grad()
def calibrated_probabilities(config: PlatformConfig, frame: pd.DataFrame, module: torch.nn.Module | None) -> dict[str, np.ndarray]:
    """objective -> probabilities of `frame`'s rows (domain, z_<o>) through `module` (a
    CellCalibration: the very module the saved model runs), or uncalibrated without one."""
    dom = {d: i for i, d in enumerate(config.domain_names)}
    domain = torch.as_tensor(frame["domain"].map(dom).to_numpy(np.int64))
    logits = {o: torch.as_tensor(frame[f"z_{o}"].to_numpy(np.float32)) for o in config.objective_names}
    if module is not None:
        logits = module(logits, domain)
    return {o: torch.sigmoid(v).numpy() for o, v in logits.items()}


def _quality(y: np.ndarray, p: np.ndarray) -> dict[str, float]:
    return {"calibration": calibration(y, p), "ece": expected_calibration_error(y, p), "ne": ne(y, p), "auc": auc(y, p)}


def effect(config: PlatformConfig, frame: pd.DataFrame, before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> dict[str, dict]:
    """Per cell: rows, positives and calibration (sum p / sum y), ECE, NE, AUC before and after,
    and `shift`: whether the step moved the calibration away from 1 beyond noise
    (lattice.evaluation.calibration_shift)."""
    from lattice.evaluation.calibration_shift import calibration_shift

    out = {}
    for cell, sel in _cells(config, frame).items():
        o = cell.split("/", 1)[1]
        y = frame.loc[sel, f"label_{o}"].to_numpy(np.float64)
        out[cell] = {"n": int(sel.sum()), "positives": int(y.sum()),
                     "before": _quality(y, before[o][sel]), "after": _quality(y, after[o][sel]),
                     "shift": calibration_shift(y, before[o][sel], after[o][sel])}
    return out


def summary(maps: dict[str, Any], validation: dict[str, dict], test: dict[str, dict]) -> dict[str, Any]:
    """What metrics.json records of the calibration stage."""
    cells = {}
    for cell, m in maps["cells"].items():
        cells[cell] = {"fit": m["method"], "knots": len(m["x"]), "validation": validation.get(cell), "test": test.get(cell)}
        if "choice" in m:
            cells[cell]["choice"] = m["choice"]
            cells[cell]["candidate"] = (m.get("candidate") or {}).get("method", m["method"])
    finite = [c for c in cells.values() if c["test"] and c["test"]["positives"] > 0]

    def mean(part: str, key: str) -> float:
        xs = [c["test"][part][key] for c in finite if c["test"][part][key] == c["test"][part][key]]
        return float(np.mean(xs)) if xs else math.nan

    moved = sorted(c for c, v in cells.items() if ((v["test"] or {}).get("shift") or {}).get("moved_away"))
    return {"method": maps["method"], "min_positives": maps["min_positives"], "choice": maps.get("choice", "always"),
            # cells whose map acts on the scores (an identity map, for a cell without positives or
            # negatives, does not)
            "kept": sorted(c for c, m in maps["cells"].items() if m["method"] not in ("identity", "none")),
            "test_moved_away": moved, "cells": cells,
            "macro_test": {part: {k: mean(part, k) for k in ("ece", "ne")} for part in ("before", "after")}}
