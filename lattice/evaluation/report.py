"""Evaluation report: one JSON with every model's per-cell metrics side by side plus the oracle,
each model's calibration stage (per cell: map kept or dropped and why, test calibration and ECE
before / after, flagged where the step moved it further from 1 beyond noise), the paired
bootstrap NE difference of every pair of models, and two plots (per-cell NE bars, training curves)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: reports are written by CLI runs and Airflow tasks
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from lattice.config import PlatformConfig  # noqa: E402


def comparison(config: PlatformConfig, metrics: dict[str, dict]) -> dict:
    cells = [f"{d}/{o}" for d, o in config.cells()]
    table = {c: {name: m["cells"].get(c, {}).get("ne") for name, m in metrics.items()} for c in cells}
    for c in cells:
        oracle = [m["cells"].get(c, {}).get("oracle_ne") for m in metrics.values()]
        oracle = [x for x in oracle if x is not None]
        if oracle:
            table[c]["oracle"] = oracle[0]
    macro = {name: m["macro"] for name, m in metrics.items()}
    by_obj = {name: m.get("by_objective", {}) for name, m in metrics.items()}
    return {"cells": cells, "ne_by_cell": table, "macro": macro, "by_objective": by_obj,
            "cost": {name: m.get("cost") for name, m in metrics.items()}}


def calibration_table(metrics: dict[str, dict]) -> dict[str, dict]:
    """model -> cell -> the calibration stage's map, whether the per-cell choice kept it (and why),
    its test calibration / ECE before and after, and `moved_away`: the step moved the test
    calibration further from 1 beyond noise (lattice.evaluation.calibration_shift). Models trained
    with `training.calibration: none` have none; models trained before the choice existed have
    every map kept and no shift recorded (None)."""
    out = {}
    for name, m in metrics.items():
        cal = m.get("calibration")
        if not cal:
            continue
        cells = {}
        for cell, c in cal.get("cells", {}).items():
            test, choice = c.get("test") or {}, c.get("choice") or {}
            shift = test.get("shift") or {}
            cells[cell] = {"fit": c.get("fit"), "candidate": c.get("candidate", c.get("fit")),
                           "kept": choice.get("kept", True), "reason": choice.get("reason"),
                           "val_ne_before": choice.get("val_ne_before"), "val_ne_after": choice.get("val_ne_after"),
                           **{f"{k}_{part}": test.get(part, {}).get(k)
                              for part in ("before", "after") for k in ("calibration", "ece")},
                           "distance_change": shift.get("distance_change"), "distance_change_interval":
                               [shift.get("low"), shift.get("high")] if shift else None,
                           "moved_away": shift.get("moved_away") if shift else None}
        out[name] = {"method": cal.get("method"), "choice": cal.get("choice", "always"),
                     "moved_away": sorted(c for c, v in cells.items() if v["moved_away"]), "cells": cells}
    return out


def calibration_lines(table: dict[str, dict]) -> list[str]:
    """The evaluation summary's calibration part: per model, the cells whose map was kept and any
    cell whose test calibration the step moved further from 1 beyond noise (flagged)."""
    lines = []
    for name, t in table.items():
        kept = [c for c, v in t["cells"].items() if v["kept"] and v["fit"] not in ("identity", "none")]
        lines.append(f"{name}: calibration ({t['method']}, {t['choice']}) applied in {len(kept)} of {len(t['cells'])} cells"
                     + (f" ({', '.join(kept)})" if kept else ""))
        for cell in t["moved_away"]:
            v = t["cells"][cell]
            lo, hi = v["distance_change_interval"]
            lines.append(f"    FLAG {cell}: test calibration {v['calibration_before']:.3f} -> {v['calibration_after']:.3f}, "
                         f"further from 1 by {v['distance_change']:+.3f} [{lo:+.3f}, {hi:+.3f}] (beyond noise)")
    return lines


def _signed(x: float | None) -> str:
    return "nan" if x is None or x != x else f"{x:+.4f}"


def comparison_lines(comparisons: list[dict]) -> list[str]:
    """One line per model pair (macro), per objective (when there are several) and per cell:
    NE(B) - NE(A) [95% interval] and the verdict."""
    lines = []
    for c in comparisons:
        if "error" in c:
            lines.append(f"{c['b']} - {c['a']}: not compared: {c['error']}")
            continue
        m = c["macro"]
        lines.append(f"{c['b']} - {c['a']}: macro NE {_signed(m['ne_diff'])} [{_signed(m['low'])}, {_signed(m['high'])}] "
                     f"{m['verdict']}")
        objectives = c.get("by_objective") or {}
        for o, v in objectives.items() if len(objectives) > 1 else ():
            lines.append(f"    {'macro ' + o:24s} {_signed(v['ne_diff'])} [{_signed(v['low'])}, {_signed(v['high'])}] {v['verdict']}")
        for cell, v in c["cells"].items():
            lines.append(f"    {cell:24s} {_signed(v['ne_diff'])} [{_signed(v['low'])}, {_signed(v['high'])}] {v['verdict']}")
    return lines


def write_report(config: PlatformConfig, out: Path, metrics: dict[str, dict], histories: dict[str, dict],
                 comparisons: list[dict] | None = None) -> dict:
    """evaluation.json (+ plots). `comparisons`: lattice.evaluation.compare.compare_models's pairs."""
    out.mkdir(parents=True, exist_ok=True)
    comp = comparison(config, metrics)
    cells = comp["cells"]
    series = list(metrics) + (["oracle"] if any("oracle" in comp["ne_by_cell"][c] for c in cells) else [])
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(cells) * max(1, len(series)) / 3), 4))
    w = 0.8 / max(len(series), 1)
    shown = [comp["ne_by_cell"][c].get(s) for c in cells for s in series]
    shown = [v for v in shown if v is not None and v == v]
    for i, s in enumerate(series):
        vals = [comp["ne_by_cell"][c].get(s) or np.nan for c in cells]
        ax.bar(np.arange(len(cells)) + i * w, vals, w, label=s)
    ax.set_xticks(np.arange(len(cells)) + w * (len(series) - 1) / 2, cells, rotation=30, ha="right")
    if shown:  # differences between models are a few percent: zoom in on them
        ax.set_ylim(max(0.0, min(shown) - 0.05), max(shown) + 0.02)
    ax.set_ylabel("NE (lower is better)")
    ax.set_title("Test NE per (domain, objective) cell")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "ne_by_cell.png", dpi=110)
    plt.close(fig)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, h in histories.items():
        if h.get("steps"):
            s = np.array(h["steps"])
            a1.plot(s[:, 0], s[:, 1], label=name)
        if h.get("epochs"):
            a2.plot([e["epoch"] for e in h["epochs"]], [e["val_macro_ne"] for e in h["epochs"]], marker="o", label=name)
    a1.set(xlabel="step", ylabel="train loss (10-step mean)", title="Training loss")
    a2.set(xlabel="epoch", ylabel="validation macro NE", title="Validation")
    a1.legend(fontsize=8)
    a2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "training_curves.png", dpi=110)
    plt.close(fig)

    from lattice.data.split import describe
    from lattice.evaluation.versus import versus_trees

    # the deep models against the tree baselines, cell by cell (None without a tree model)
    comp["vs_trees"] = versus_trees(metrics, comparisons)
    calibration = calibration_table(metrics)
    report = {"models": list(metrics), "split": describe(config), **comp, "metrics": metrics,
              "calibration": calibration, "comparisons": comparisons or [],
              # per deep model: the validation kept and why training stopped (lattice.training.stopping)
              "training": {name: m["training"] for name, m in metrics.items() if m.get("training")},
              "plots": {"ne_by_cell": str(out / "ne_by_cell.png"), "training_curves": str(out / "training_curves.png")}}
    (out / "evaluation.json").write_text(json.dumps(report, indent=1, default=lambda x: None))
    return {"models": list(metrics), "macro": comp["macro"], "report": str(out / "evaluation.json"), "plots": report["plots"],
            "comparisons": comparisons or [], "vs_trees": comp["vs_trees"], "calibration": calibration}
