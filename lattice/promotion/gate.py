"""The gate's checks over measured numbers; no I/O here, so every rule is unit-testable.

Rules (thresholds from `config.promotion`):
  - per (domain, objective) cell: challenger NE <= champion NE * (1 + δ), both measured on the
    same fresh evaluation window. With the paired error of the ratio (both models scored the same
    rows), the cell fails only when the interval of the ratio (at `calibration_confidence`) lies
    wholly above 1 + δ: a conversion cell with 80 positives moves by a few percent from day to
    day, and a point check rejects a sound retrain for that noise (after a shock, for days);
  - per cell: calibration (sum of predictions / sum of labels) within [low, high], unless the
    cell is too small to tell: with P positives the count of positives itself varies by about
    sqrt(P) from window to window, so a well calibrated model scores 1 ± 2/sqrt(P) (±16% at 150
    positives). The check fails only when the confidence interval of the calibration (at
    `calibration_confidence`) lies wholly outside the bounds, and the champion is not further
    from 1 on the same rows (after a shock both are off; the nearer one should serve);
  - the student's macro NE <= its teacher's * (1 + ε);
  - the exported artifact predicts like the training model (max |Δp| within tolerance),
    its single-request p99 latency and its size are within budget;
  - with no champion yet (the first model): every cell's NE <= floors.max_ne and AUC >= floors.min_auc
    (both judged by their confidence intervals, like calibration: a cell with ten positives cannot
    show that a model ranks worse than the floor, nor that its NE of 1.01 is worse than the base rate).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any

from lattice.config.schema import Promotion
from lattice.evaluation.metrics import calibration_interval


@dataclass(frozen=True)
class CellMetrics:
    ne: float
    auc: float
    calibration: float
    count: int = 0
    positives: int = 0
    expected: float = float("nan")
    """Sum of the predicted probabilities over the cell's labelled rows."""
    variance: float = 0.0
    """Sum of p(1 - p): the variance of the positive count if the predictions were calibrated."""
    ne_se: float = float("nan")
    """Standard error of the NE (lattice.evaluation.metrics.ne_standard_error); NaN: unknown."""

    def auc_interval(self, z: float) -> tuple[float, float]:
        """(low, high) of the AUC at z standard errors (Hanley & McNeil 1982): a cell with ten
        positives cannot tell an AUC of 0.4 from one of 0.6."""
        pos, neg = self.positives, self.count - self.positives
        a = self.auc
        if pos <= 0 or neg <= 0 or a != a or z <= 0:
            return a, a
        q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
        var = (a * (1 - a) + (pos - 1) * (q1 - a * a) + (neg - 1) * (q2 - a * a)) / (pos * neg)
        half = z * math.sqrt(max(var, 0.0))
        return max(a - half, 0.0), min(a + half, 1.0)

    def calibration_interval(self, z: float) -> tuple[float, float]:
        """(low, high) of sum p / sum y when the positive count may be off by z standard
        deviations (lattice.evaluation.metrics.calibration_interval)."""
        return calibration_interval(self.calibration, self.expected, self.positives, self.variance, z)


Cell = tuple[str, str]


@dataclass(frozen=True)
class PairedNE:
    """Challenger NE / champion NE on the same rows, and the standard error of that ratio
    (lattice.evaluation.metrics.paired_ne_ratio)."""

    ratio: float
    se: float


@dataclass
class GateInputs:
    challenger: dict[Cell, CellMetrics]
    champion: dict[Cell, CellMetrics] | None
    """None when there is no champion yet (the floors apply instead)."""
    student_macro_ne: float
    teacher_macro_ne: float | None
    export_max_abs_diff: float
    export_tolerance: float
    latency_p99_ms: float
    """p99 CPU time of one single-row prediction (process time: robust to other jobs on the machine)."""
    artifact_mb: float
    paired: dict[Cell, PairedNE] | None = None
    """Per cell, the challenger's NE over the champion's with its paired error; None (or a missing
    cell) judges the point estimates alone."""
    fp8_fp32: dict[Cell, CellMetrics] | None = None
    """With FP8 sites in the challenger: its training weights run in FP32 on the same window (the
    FP8 artifact's cells are `challenger`); None when it has no FP8 site."""


@dataclass(frozen=True)
class Reason:
    check: str
    passed: bool
    message: str
    cell: str | None = None
    value: float | None = None
    bound: float | None = None


@dataclass
class Decision:
    passed: bool
    reasons: list[Reason] = field(default_factory=list)

    @property
    def failed(self) -> list[Reason]:
        return [r for r in self.reasons if not r.passed]

    @property
    def failed_cells(self) -> list[str]:
        return sorted({r.cell for r in self.failed if r.cell})

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision": "promote" if self.passed else "reject",
            "passed": self.passed,
            "failed_cells": self.failed_cells,
            "reasons": [asdict(r) for r in self.reasons],
        }


def _name(cell: Cell) -> str:
    return f"{cell[0]}/{cell[1]}"


def _cell_checks(p: Promotion, inputs: GateInputs) -> list[Reason]:
    out: list[Reason] = []
    lo, hi = p.calibration
    z = NormalDist().inv_cdf(0.5 + p.calibration_confidence / 2) if p.calibration_confidence > 0 else 0.0
    for cell, m in sorted(inputs.challenger.items()):
        name = _name(cell)
        champ = inputs.champion.get(cell) if inputs.champion is not None else None
        if inputs.champion is not None:
            if champ is None:
                out.append(Reason("ne_vs_champion", True, f"{name}: new cell (champion has none); NE {m.ne:.4f}", name, m.ne))
            else:
                bound = champ.ne * (1 + p.max_ne_regression)
                ok = m.ne <= bound
                shown = f"{name}: NE {m.ne:.4f} vs champion {champ.ne:.4f} (limit {bound:.4f}, δ={p.max_ne_regression:g})"
                pair = (inputs.paired or {}).get(cell)
                if not ok and pair is not None and pair.se == pair.se and z > 0:
                    low, high = pair.ratio - z * pair.se, pair.ratio + z * pair.se
                    ok = low <= 1 + p.max_ne_regression  # fails only when the data show it is worse than δ
                    shown += (f": worse by {100 * (m.ne / champ.ne - 1):.2f}%, {100 * p.calibration_confidence:g}% paired "
                              f"interval {100 * (low - 1):+.2f}% to {100 * (high - 1):+.2f}%"
                              + (": within noise" if ok else ": beyond noise"))
                elif not ok:
                    shown += f": worse by {100 * (m.ne / champ.ne - 1):.2f}%"
                out.append(Reason("ne_vs_champion", ok, shown, name, m.ne, bound))
        else:
            half = z * m.ne_se if m.ne_se == m.ne_se else 0.0
            ok = m.ne - half <= p.floors.max_ne  # fails only when the data show it is worse than the floor
            shown = f"{name}: NE {m.ne:.4f} (floor: at most {p.floors.max_ne:g}"
            if m.ne > p.floors.max_ne:
                shown += (f"; {100 * p.calibration_confidence:g}% interval [{m.ne - half:.4f}, {m.ne + half:.4f}]"
                          + (": within noise" if ok else ": above the floor"))
            out.append(Reason("ne_floor", ok, shown + ")", name, m.ne, p.floors.max_ne))
            a_lo, a_hi = m.auc_interval(z)
            ok = a_hi >= p.floors.min_auc  # fails only when the data show it ranks worse than the floor
            shown = f"{name}: AUC {m.auc:.4f} (floor: at least {p.floors.min_auc:g}"
            if m.auc < p.floors.min_auc:
                shown += (f"; {100 * p.calibration_confidence:g}% interval [{a_lo:.3f}, {a_hi:.3f}] over {m.positives} positives"
                          + (": within noise" if ok else ": below the floor"))
            out.append(Reason("auc_floor", ok, shown + ")", name, m.auc, p.floors.min_auc))
        c_lo, c_hi = m.calibration_interval(z)
        ok = c_hi >= lo and c_lo <= hi  # fails only when the data show it is outside the bounds
        inside = lo <= m.calibration <= hi
        shown = f"{name}: calibration {m.calibration:.3f} (bounds [{lo:g}, {hi:g}]"
        if not inside:
            shown += (f"; {100 * p.calibration_confidence:g}% interval [{c_lo:.3f}, {c_hi:.3f}] over "
                      f"{m.positives} positives" + (": within noise" if ok else ": outside the bounds"))
            if not ok and _closer_to_one(m, champ):
                # the bound keeps a miscalibrated model from replacing a good one; when the served
                # model is further off on the same rows (a shocked market, a drifted champion),
                # rejecting the challenger keeps the worse calibration in service
                ok = True
                shown += f", but closer to 1 than the champion's {champ.calibration:.3f} on the same rows"
        out.append(Reason("calibration", ok, shown + ")", name, m.calibration, lo if m.calibration < lo else hi))
    return out


def _closer_to_one(m: CellMetrics, champ: CellMetrics | None) -> bool:
    """The challenger's calibration is nearer 1 than the champion's, in ratio (0.5 and 2 are as
    far off), on the same rows."""
    if champ is None or not (m.calibration > 0 and champ.calibration > 0):
        return False
    return abs(math.log(m.calibration)) < abs(math.log(champ.calibration))


def _fp8_checks(inputs: GateInputs, tolerance: float) -> list[Reason]:
    """FP8 sites must not cost more than `tolerance` (relative NE) against the same weights in FP32,
    in every cell: the plan's error estimate is a prediction, this is the measurement."""
    out = []
    for cell, m in inputs.challenger.items():
        ref = inputs.fp8_fp32.get(cell)
        if ref is None or not (ref.ne == ref.ne):
            continue
        bound = ref.ne * (1 + tolerance)
        out.append(Reason("fp8_parity", m.ne <= bound,
                          f"FP8 artifact NE {m.ne:.4f} vs the same weights in FP32 {ref.ne:.4f} (limit {bound:.4f})",
                          "/".join(cell), m.ne, bound))
    return out


def decide(p: Promotion, inputs: GateInputs) -> Decision:
    if not inputs.challenger:
        return Decision(False, [Reason("cells", False, "the challenger has no evaluated cell; is the evaluation window empty?")])
    reasons = _cell_checks(p, inputs)
    if inputs.teacher_macro_ne is None:
        reasons.append(Reason("teacher_epsilon", False, "no teacher metrics found; train and register the teacher first"))
    else:
        bound = inputs.teacher_macro_ne * (1 + p.teacher_epsilon)
        ok = inputs.student_macro_ne <= bound
        reasons.append(Reason(
            "teacher_epsilon", ok,
            f"student macro NE {inputs.student_macro_ne:.4f} vs teacher {inputs.teacher_macro_ne:.4f} "
            f"(limit {bound:.4f}, ε={p.teacher_epsilon:g})", None, inputs.student_macro_ne, bound,
        ))
    ok = inputs.export_max_abs_diff <= inputs.export_tolerance
    reasons.append(Reason(
        "export_parity", ok,
        f"exported artifact vs training model: max |Δp| {inputs.export_max_abs_diff:.2e} (tolerance {inputs.export_tolerance:g})",
        None, inputs.export_max_abs_diff, inputs.export_tolerance,
    ))
    if inputs.fp8_fp32 is not None:
        reasons += _fp8_checks(inputs, p.fp8_tolerance)
    ok = inputs.latency_p99_ms <= p.max_latency_ms
    reasons.append(Reason(
        "latency", ok, f"single-request p99 CPU time {inputs.latency_p99_ms:.2f} ms (budget {p.max_latency_ms:g} ms)",
        None, inputs.latency_p99_ms, p.max_latency_ms,
    ))
    ok = inputs.artifact_mb <= p.max_artifact_mb
    reasons.append(Reason(
        "artifact_size", ok, f"artifact {inputs.artifact_mb:.2f} MB (budget {p.max_artifact_mb:g} MB)",
        None, inputs.artifact_mb, p.max_artifact_mb,
    ))
    return Decision(all(r.passed for r in reasons), reasons)
