"""Did a calibration step move a cell's calibration away from 1 by more than noise?

A cell's calibration is sum p / sum y. Before and after the step share the cell's rows and labels,
so the question is paired: is |after - 1| - |before - 1| > 0 on every plausible resample of those
rows? Both predictions and the labels are resampled together (the Poisson bootstrap of
`lattice.evaluation.compare`): where the cell has few positives its label total itself is noisy,
and a step that moves the predicted total from 1.22 to 1.33 times 42 observed positives is not
flagged unless that total is far enough from every plausible expected total. A cell is flagged
(`moved_away`) when the `level` interval of the difference lies wholly above 0.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lattice.evaluation.compare import LEVEL, poisson_sums

RESAMPLES = 400
"""Resamples per cell: the flag reads the 2.5% percentile, which 200 resamples place coarsely."""


def _distance_change(y: np.ndarray, before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """(..., 3) sums of (y, p before, p after) -> |after - 1| - |before - 1| (NaN without positives)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        cb, ca = before / y, after / y
        out = np.abs(ca - 1) - np.abs(cb - 1)
    return np.where(y > 0, out, np.nan)


def calibration_shift(y: np.ndarray, before: np.ndarray, after: np.ndarray, resamples: int = RESAMPLES, seed: int = 0,
                      level: float = LEVEL) -> dict[str, Any]:
    """One cell's rows: labels `y`, probabilities `before` and `after` the step -> the calibrations,
    the change of their distance from 1 with its paired bootstrap interval, and `moved_away`."""
    m = np.stack([np.asarray(y, np.float64), np.asarray(before, np.float64), np.asarray(after, np.float64)], axis=1)
    total = m.sum(axis=0)
    point = float(_distance_change(*total))
    out = {"before": float(total[1] / total[0]) if total[0] > 0 else math.nan,
           "after": float(total[2] / total[0]) if total[0] > 0 else math.nan,
           "distance_change": point, "low": math.nan, "high": math.nan, "level": level, "moved_away": False}
    if total[0] <= 0 or len(m) == 0:
        return out
    sums = poisson_sums(m, resamples, seed)
    change = _distance_change(sums[:, 0], sums[:, 1], sums[:, 2])
    if np.isfinite(change).any():
        lo, hi = (float(x) for x in np.nanpercentile(change, [(1 - level) / 2 * 100, (1 + level) / 2 * 100]))
        out.update(low=lo, high=hi, moved_away=bool(lo > 0))
    return out
