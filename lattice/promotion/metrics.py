"""Gate cells from one model's probabilities on the evaluation window, computed with the same
metric code as training-time evaluation (lattice.evaluation.metrics), so champion, challenger
and the offline reports never disagree on what NE means."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lattice.config import PlatformConfig
from lattice.evaluation.metrics import cell_metrics, paired_ne_ratio
from lattice.promotion.gate import Cell, CellMetrics, PairedNE


def gate_cells(config: PlatformConfig, frame: pd.DataFrame, probs: dict[str, np.ndarray]) -> dict[Cell, CellMetrics]:
    """`frame` holds domain, label_<o>, mask_<o>; `probs[o]` is aligned with its rows. Cells
    without a positive (NE undefined) are left out; the gate then reports them as missing."""
    df = frame[["domain"] + [c for o in config.objective_names for c in (f"label_{o}", f"mask_{o}")]].copy()
    for o in config.objective_names:
        df[f"p_{o}"] = np.asarray(probs[o], dtype=np.float64)
    return from_report(cell_metrics(config, df)["cells"])


def paired_cells(config: PlatformConfig, frame: pd.DataFrame, challenger: dict[str, np.ndarray],
                 champion: dict[str, np.ndarray]) -> dict[Cell, PairedNE]:
    """Per cell, the challenger's NE over the champion's on the same rows (`frame` as in
    `gate_cells`) with its paired standard error; cells without a positive are left out."""
    out: dict[Cell, PairedNE] = {}
    for d, o in config.cells():
        sel = ((frame["domain"] == d) & (frame[f"mask_{o}"] > 0)).to_numpy()
        y = frame[f"label_{o}"].to_numpy(np.float64)[sel]
        ratio, se = paired_ne_ratio(y, np.asarray(challenger[o], np.float64)[sel], np.asarray(champion[o], np.float64)[sel])
        if ratio == ratio:
            out[(d, o)] = PairedNE(ratio, se)
    return out


def from_report(cells: dict[str, dict]) -> dict[Cell, CellMetrics]:
    """{"domain/objective": {ne, auc, calibration, n, positives}} -> gate cells (NaN NE dropped)."""
    out: dict[Cell, CellMetrics] = {}
    for key, c in cells.items():
        if c.get("ne") is None or c["ne"] != c["ne"]:
            continue
        d, o = key.split("/", 1)
        out[(d, o)] = CellMetrics(ne=float(c["ne"]), auc=float(c.get("auc", float("nan"))),
                                  calibration=float(c.get("calibration", float("nan"))),
                                  count=int(c.get("n", 0)), positives=int(c.get("positives", 0)),
                                  expected=float(c.get("expected_positives", float("nan"))),
                                  variance=float(c.get("positives_variance", 0.0)),
                                  ne_se=float(c.get("ne_se", float("nan"))))
    return out


def macro_ne(cells: dict[Cell, CellMetrics]) -> float:
    return float(np.mean([m.ne for m in cells.values()])) if cells else float("nan")
