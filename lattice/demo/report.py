"""Render the demo report (a plain dict, also saved as report.json) to a self-contained HTML page
with embedded PNG plots: training curves, per-cell NE bars, reliability curves, student-vs-teacher
cost, plus the reconciliation, metrics, calibration-stage, model-pair comparison, promotion and
timing tables."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lattice.demo.html_parts import _png, _table  # noqa: E402

MODEL_ORDER = ["teacher", "student", "mmoe", "shared_bottom", "pooled", "separate", "gbdt", "gbdt_cell", "student_no_teacher"]



def version_label(version) -> str:
    """`v3`, or `(none)` where there was no champion."""
    return "(none)" if version is None else f"v{version}"

def _models(report: dict[str, Any]) -> list[str]:
    names = list(report.get("models", {}))
    return sorted(names, key=lambda m: (MODEL_ORDER.index(m) if m in MODEL_ORDER else len(MODEL_ORDER), m))


def plot_training_curves(report: dict[str, Any]) -> str | None:
    """history.json per model: {"steps": [[step, train_loss], ...], "epochs": [{"epoch", "val_macro_ne"}, ...]}."""
    curves = {m: v["history"] for m, v in report.get("models", {}).items() if v.get("history")}
    if not curves:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.6))
    for model, hist in curves.items():
        steps = hist.get("steps") or []
        if steps:
            a1.plot([s[0] for s in steps], [s[1] for s in steps], label=model)
        epochs = hist.get("epochs") or []
        if epochs:
            a2.plot([e["epoch"] for e in epochs], [e.get("val_macro_ne") for e in epochs], marker="o", label=model)
    a1.set(xlabel="step", ylabel="train loss", title="Training loss")
    a2.set(xlabel="epoch", ylabel="validation macro NE", title="Validation")
    a1.legend(fontsize=7)
    a2.legend(fontsize=7)
    return _png(fig)


def plot_ne_bars(report: dict[str, Any]) -> str | None:
    models = _models(report)
    cells = sorted({c for m in models for c in report["models"][m].get("cells", {})})
    if not cells:
        return None
    series = [(m, [report["models"][m].get("cells", {}).get(c, {}).get("ne") for c in cells]) for m in models]
    oracle = report.get("oracle", {}).get("cells", {})
    if oracle:
        series.append(("oracle", [oracle.get(c, {}).get("ne") for c in cells]))
    fig, ax = plt.subplots(figsize=(max(7, 1.3 * len(cells)), 3.8))
    width = 0.8 / len(series)
    for i, (name, vals) in enumerate(series):
        xs = [j + i * width for j in range(len(cells))]
        ax.bar(xs, [v if v is not None else 0 for v in vals], width, label=name, hatch="//" if name == "oracle" else None)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cells))], cells, rotation=20, fontsize=8)
    lows = [v for _, vals in series for v in vals if v]
    if lows:
        ax.set_ylim(max(0, min(lows) - 0.05), min(1.05, max(lows) + 0.03))
    ax.set_ylabel("NE (lower is better)")
    ax.set_title("Normalized entropy per (domain, objective)")
    ax.legend(fontsize=7, ncol=4)
    return _png(fig)


def plot_reliability(report: dict[str, Any]) -> str | None:
    curves = report.get("calibration_curves", {})
    if not curves:
        return None
    cells = sorted({c for m in curves.values() for c in m})
    fig, axes = plt.subplots(1, len(cells), figsize=(3.0 * len(cells), 3.0), squeeze=False)
    for ax, cell in zip(axes[0], cells):
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8)
        top = 0.0
        for model, by_cell in curves.items():
            pts = by_cell.get(cell)
            if pts:
                ax.plot(pts["predicted"], pts["observed"], marker="o", ms=3, label=model)
                top = max(top, max(pts["predicted"] + pts["observed"]))
        ax.set_xlim(0, top * 1.05 or 1)
        ax.set_ylim(0, top * 1.05 or 1)
        ax.set_title(cell, fontsize=9)
        ax.set_xlabel("mean predicted", fontsize=8)
    axes[0][0].set_ylabel("observed rate", fontsize=8)
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("Reliability (test split, quantile bins)", fontsize=10)
    return _png(fig)


def plot_cost(report: dict[str, Any]) -> str | None:
    cost = {m: v["cost"] for m, v in report.get("models", {}).items() if v.get("cost")}
    if "teacher" not in cost or "student" not in cost:
        return None
    keys = [k for k in ("params", "flops_per_example") if k in cost["teacher"]]
    fig, axes = plt.subplots(1, len(keys), figsize=(3.6 * len(keys), 3.0), squeeze=False)
    for ax, key in zip(axes[0], keys):
        vals = [cost["teacher"][key], cost["student"][key]]
        ax.bar(["teacher", "student"], vals, color=["#4c72b0", "#dd8452"])
        ax.set_title(f"{key} (student = {vals[1] / vals[0]:.1%})", fontsize=9)
    return _png(fig)


def metrics_rows(report: dict[str, Any]) -> list[list[Any]]:
    rows = []
    oracle = report.get("oracle", {}).get("cells", {})
    for m in _models(report):
        for cell, v in sorted(report["models"][m].get("cells", {}).items()):
            rows.append([m, cell, v.get("ne"), v.get("auc"), v.get("calibration"), oracle.get(cell, {}).get("ne")])
    return rows


def training_rows(report: dict[str, Any]) -> list[list[Any]]:
    """Per trained model: epochs run of those planned, the validation whose weights were kept and
    why training ended (history.json's `stop`, lattice.training.stopping.reason)."""
    rows = []
    for m in _models(report):
        stop = (report["models"][m].get("history") or {}).get("stop")
        if not stop:  # a tree baseline, or a model trained before runs recorded it
            continue
        kept = stop.get("kept") or {}
        rows.append([m, f"{stop.get('epochs_run')} of {stop.get('epochs_planned')}",
                     "early stop" if stop.get("stopped_early") else "all epochs",
                     kept.get("epoch"), kept.get("validation"), kept.get("val_macro_ne"), stop.get("stop_reason")])
    return rows


def comparison_rows(report: dict[str, Any]) -> list[list[Any]]:
    """One row per model pair: NE(B) - NE(A) macro with its paired bootstrap 95% interval and
    verdict, and which cells go which way."""
    rows = []
    for c in report.get("comparisons") or []:
        if "error" in c:
            rows.append([f"{c['b']} vs {c['a']}", None, "", "not compared", c["error"]])
            continue

        def said(verdict: str) -> str:
            return {"A better": f"{c['a']} better", "B better": f"{c['b']} better"}.get(verdict, verdict)

        by: dict[str, list[str]] = {}
        for cell, v in c["cells"].items():
            by.setdefault(said(v["verdict"]), []).append(cell)
        m = c["macro"]
        rows.append([f"{c['b']} vs {c['a']}", m["ne_diff"], f"[{m['low']:+.4f}, {m['high']:+.4f}]", said(m["verdict"]),
                     "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(by.items()))])
    return rows


def calibration_rows(report: dict[str, Any]) -> list[list[Any]]:
    """Per model and cell: the calibration stage's map (kept or dropped by the per-cell choice), the
    test calibration / ECE before -> after, and a flag where the step moved the test calibration
    further from 1 beyond noise (lattice.evaluation.report.calibration_table)."""
    from lattice.evaluation.report import calibration_table

    rows = []
    table = calibration_table({m: report["models"][m] for m in _models(report)})
    for m, t in table.items():
        cal = report["models"][m].get("calibration") or {}
        for cell, v in sorted(t["cells"].items()):
            test = (cal.get("cells", {}).get(cell) or {}).get("test") or {}
            kept = "kept" if v["kept"] else f"dropped ({v['candidate']})"
            flag = {True: "FLAG: further from 1", False: "no", None: "n/a"}[v["moved_away"]]
            rows.append([m, cell, v["fit"], kept, test.get("positives"), v["calibration_before"], v["calibration_after"], flag,
                         v["ece_before"], v["ece_after"]])
    return rows


def vs_trees_html(versus: dict[str, Any] | None) -> list[str]:
    """The deep models against the best gradient-boosted-trees baseline per cell
    (lattice.evaluation.versus): one sentence per deep model, then the ΔNE table."""
    if not versus:
        return []
    parts = ["<h2>Deep models vs gradient-boosted trees</h2>"]
    items = []
    deep = sorted(versus["summary"], key=lambda m: (MODEL_ORDER.index(m) if m in MODEL_ORDER else len(MODEL_ORDER), m))
    for d in deep:
        s = versus["summary"][d]
        if not s["cells"]:
            continue
        cls = "ok" if s["better"] > s["worse"] else "bad" if s["worse"] > s["better"] else ""
        items.append(f"<li><b class='{cls}'>{html.escape(d)}</b>: better than trees in {s['better']}, tied in {s['tie']}, "
                     f"worse in {s['worse']} of {s['cells']} cells (mean ΔNE {s['mean_delta']:+.4f})</li>")
    parts.append("<ul>" + "".join(items) + "</ul>")
    rows = [[cell, f"{r['tree']} {r['tree_ne']:.4f}"]
            + [f"{r['deep'][d]['delta']:+.4f} ({r['deep'][d]['verdict']})" if d in r["deep"] else "" for d in deep]
            for cell, r in versus["cells"].items()]
    parts.append(_table(rows, ["cell", "best tree (test NE)"] + [f"{d} ΔNE" for d in deep]))
    parts.append("<p>ΔNE = the deep model's test NE minus the best tree's (negative: the deep model is better); "
                 "a tie is a difference within noise.</p>")
    return parts


def render_html(report: dict[str, Any]) -> str:
    h = report.get("header", {})
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Lattice demo report</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}"
        "table{border-collapse:collapse;margin:0.6em 0 1.4em}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:right}"
        "th{background:#f0f0f0}td:first-child,td:nth-child(2){text-align:left}.ok{color:#1a7f37}.bad{color:#c0392b}"
        "img{max-width:100%;margin:0.5em 0}</style></head><body>",
        f"<h1>Lattice demo report: <code>{html.escape(str(h.get('config', '')))}</code></h1>",
        f"<p>Finished {html.escape(str(h.get('finished_at', '')))} in {html.escape(str(h.get('workdir', '')))}</p>",
    ]
    status = report.get("status", "unknown")
    parts.append(f"<p>Status: <b class='{'ok' if status == 'ok' else 'bad'}'>{html.escape(status)}</b></p>")
    if report.get("error"):
        parts.append(f"<pre class='bad'>{html.escape(report['error'])}</pre>")

    parts.append("<h2>Headline: macro NE per objective</h2>")
    head = report.get("headline", {})
    if head:
        objs = sorted({o for v in head.values() for o in v})
        parts.append(_table([[m] + [head[m].get(o) for o in objs] for m in head], ["model"] + objs))

    parts += vs_trees_html(report.get("vs_trees"))

    rec = report.get("pipeline", {}).get("reconciliation", {})
    if rec:
        parts.append("<h2>Pipeline reconciliation</h2>")
        rows = [[d, v.get("in"), v.get("out"), v.get("quarantined"), v.get("skipped", 0),
                 "yes" if v.get("in") == v.get("out", 0) + v.get("quarantined", 0) + v.get("skipped", 0) else "NO"]
                for d, v in rec.items()]
        parts.append(_table(rows, ["domain", "rows in", "rows out", "quarantined", "outside window", "reconciles"]))
        reasons = report.get("pipeline", {}).get("quarantine_reasons", {})
        if reasons:
            parts.append(_table([[r, n] for r, n in reasons.items()], ["quarantine reason", "rows"]))

    parts.append("<h2>Per-cell quality (test split)</h2>")
    if h.get("split"):
        parts.append(f"<p>Every model was trained, validated and tested on one split: {html.escape(str(h['split']))}.</p>")
    parts.append(_table(metrics_rows(report), ["model", "cell", "NE", "AUC", "calibration", "oracle NE"]))
    if calibration_rows(report):
        parts.append("<h3>Calibration stage (fitted per cell on the validation split, kept only where it improved validation NE beyond noise, measured on test)</h3>")
        parts.append(_table(calibration_rows(report), ["model", "cell", "map", "choice", "test positives", "calibration before",
                                                       "after", "moved away from 1 beyond noise", "ECE before", "after"]))
    if comparison_rows(report):
        parts.append("<h3>Model pairs on the same test rows: NE(B) &minus; NE(A), paired bootstrap 95% interval</h3>")
        parts.append(_table(comparison_rows(report), ["B vs A", "macro NE diff", "95% interval", "verdict", "cells"]))

    if training_rows(report):
        parts.append("<h3>Training: the validation kept and why each run stopped</h3>")
        parts.append(_table(training_rows(report), ["model", "epochs run", "ended by", "kept epoch", "validation in epoch",
                                                    "validation macro NE", "why"]))

    for title, fn in (("Training curves", plot_training_curves), ("NE per cell", plot_ne_bars),
                      ("Calibration", plot_reliability), ("Student vs teacher cost", plot_cost)):
        img = fn(report)
        if img:
            parts.append(f"<h2>{title}</h2><img alt='{title}' src='data:image/png;base64,{img}'>")

    promo = report.get("promotion")
    if promo:
        parts.append("<h2>Promotion decision</h2>")
        decision = promo.get("decision", "?")
        parts.append(f"<p>Decision: <b class='{'ok' if decision == 'promote' else 'bad'}'>{html.escape(str(decision))}</b> "
                     f"(champion {version_label(promo.get('champion_before'))} → {version_label(promo.get('champion_after'))}, "
                     f"challenger v{promo.get('challenger_version')})</p>")
        items = []
        for r in promo.get("reasons", []):
            mark = "<span class='ok'>✓</span>" if r.get("passed") else "<span class='bad'>✗</span>"
            where = f" [{html.escape(r['cell'])}]" if r.get("cell") else ""
            items.append(f"<li>{mark} {html.escape(r.get('check', ''))}{where}: {html.escape(r.get('message', ''))}</li>")
        parts.append("<ul>" + "".join(items) + "</ul>")

    from lattice.demo.report_days import days_html

    parts += days_html(report)

    serving = report.get("serving")
    if serving:
        parts.append("<h2>Serving check</h2>")
        parts.append(_table([[k, v] for k, v in serving.items()], ["measure", "value"]))

    parts.append("<h2>Timings</h2>")
    parts.append(_table([[t["stage"], t["title"], t["seconds"], t["status"]] for t in report.get("timings", [])],
                        ["stage", "what", "seconds", "status"]))
    machine = h.get("machine", {})
    parts.append(_table([[k, v] for k, v in machine.items()], ["machine", ""]))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(report: dict[str, Any], path: Path) -> Path:
    path.write_text(render_html(report))
    return path
