"""The monitoring report: one self-contained HTML page (PNG plots inline, the demo report's
style) with online calibration per cell over time beside the calibration rules' bounds, drift
per feature, the rules that tripped and the cells flagged for a person."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pandas as pd

from lattice.demo.report import _png, plt


def _bounds(rules: list) -> list[tuple[float, float]]:
    return [(r.low, r.high) for r in rules if r.kind == "calibration"]


def plot_calibration(cells: pd.DataFrame, rules: list) -> str | None:
    """One panel per (domain, objective): calibration per period, one line per model version."""
    if cells.empty:
        return None
    cells = cells[cells["calibration"].notna()]  # a period without positives has no ratio
    keys = list(cells.groupby(["domain", "objective"]).groups)
    if not keys:
        return None
    cols = min(3, len(keys))
    rows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, (domain, objective) in zip(axes.flat, keys):
        cell = cells[(cells["domain"] == domain) & (cells["objective"] == objective)].sort_values("period_start")
        for version, g in cell.groupby("model_version"):
            ax.plot(g["period_start"], g["calibration"], marker="o", label=f"v{version}" if version >= 0 else "unregistered")
        for low, high in _bounds(rules):
            ax.axhspan(low, high, color="#1a7f37", alpha=0.08)
        ax.axhline(1.0, color="#888", lw=0.8, ls="--")
        ax.set_title(f"{domain} / {objective}", fontsize=9)
        ax.set_ylabel("sum p / sum y", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.tick_params(axis="x", rotation=30)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    fig.suptitle("Online calibration per cell (band: the calibration rules' bounds)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return _png(fig)


def _table(frame: pd.DataFrame, columns: list[str]) -> str:
    if frame.empty:
        return "<p>(none)</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for _, r in frame[columns].iterrows():
        cells = []
        for v in r:
            if isinstance(v, float):
                v = "" if v != v else f"{v:.4f}"
            cells.append(f"<td>{html.escape(str(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _findings(items: list[dict], title: str) -> list[str]:
    parts = [f"<h2>{html.escape(title)}</h2>"]
    if not items:
        return parts + ["<p>(none)</p>"]
    parts.append("<ul>")
    for f in items:
        cell = f"{f['domain']} / {f.get('objective') or f.get('feature')}"
        parts.append(f"<li><b>{html.escape(f['kind'])}</b> (rule {f['rule']}) in <code>{html.escape(cell)}</code>, "
                     f"model v{f['model_version']}, periods {html.escape(', '.join(f['periods']))}: "
                     f"{html.escape(f['reason'])}; figures {html.escape(str(f['figures']))}</li>")
    return parts + ["</ul>"]


def render(summary: dict[str, Any], cells: pd.DataFrame, drift: pd.DataFrame, rules: list) -> str:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Lattice monitoring report</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}"
        "table{border-collapse:collapse;margin:0.6em 0 1.4em}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:right}"
        "th{background:#f0f0f0}td:first-child,td:nth-child(2){text-align:left}.bad{color:#c0392b}"
        "img{max-width:100%;margin:0.5em 0}</style></head><body>",
        f"<h1>Lattice monitoring: <code>{html.escape(str(summary.get('config', '')))}</code></h1>",
        f"<p>Predictions {summary['rows']['logged']} logged, {summary['rows']['joined']} with their example, "
        f"{summary['rows']['pending']} waiting for labels; window {html.escape(str(summary.get('start')))} to "
        f"{html.escape(str(summary.get('end')))}, period {html.escape(summary['period'])}.</p>",
    ]
    parts += _findings(summary.get("tripped", []), "Rules that tripped")
    flagged = summary.get("needs_person", [])
    if flagged:
        parts += ["<div class='bad'>"] + _findings(flagged, "Needs a person (still tripping after a retrain)") + ["</div>"]
    png = plot_calibration(cells, rules)
    if png:
        parts.append(f"<img src='data:image/png;base64,{png}' alt='calibration per cell'>")
    parts.append("<h2>Per-cell figures</h2>")
    parts.append(_table(cells, ["domain", "objective", "model_version", "period", "logged", "count", "pending", "positives",
                                "label_rate", "prediction_mean", "calibration", "ne", "auc", "unknown_entity_rate"]) if not cells.empty else "<p>(none)</p>")
    parts.append("<h2>Feature drift (PSI against the training window)</h2>")
    parts.append(_table(drift, ["domain", "feature", "period", "psi", "rows"]) if not drift.empty else "<p>(none)</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write(path: Path, summary: dict[str, Any], cells: pd.DataFrame, drift: pd.DataFrame, rules: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(summary, cells, drift, rules))
    return path
