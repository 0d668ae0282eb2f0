"""The report's daily rounds (lattice.demo.life): a table of what each round trained on and what
the gate decided, and the next-day NE per cell over the days for the challenger and the champion."""

from __future__ import annotations

import html
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lattice.demo.html_parts import _png, _table  # noqa: E402


def _rounds(report: dict[str, Any]) -> list[dict[str, Any]]:
    return (report.get("days") or {}).get("rounds") or []


def day_series(rounds: list[dict[str, Any]]) -> dict[str, dict[str, list[tuple[str, float]]]]:
    """cell -> role -> [(day, next-day NE)] from the gates' MLflow series
    (`next_day.<role>.<domain>.<objective>.ne`)."""
    out: dict[str, dict[str, list[tuple[str, float]]]] = {}
    for r in rounds:
        day = r.get("judged_on") or r.get("test_day")
        for key, (value, _step) in (r.get("series") or {}).items():
            _, role, domain, objective, metric = key.split(".", 4)
            if metric == "ne":
                out.setdefault(f"{domain}/{objective}", {}).setdefault(role, []).append((day, float(value)))
    return out


def plot_days(report: dict[str, Any]) -> str | None:
    series = day_series(_rounds(report))
    if not series:
        return None
    cells = sorted(series)
    fig, axes = plt.subplots(1, len(cells), figsize=(3.2 * len(cells), 3.0), squeeze=False)
    for ax, cell in zip(axes[0], cells):
        for role, style in (("challenger", "o-"), ("champion", "s--")):
            points = series[cell].get(role) or []
            if points:
                ax.plot([d[5:] for d, _ in points], [v for _, v in points], style, label=role)
        ax.set_title(cell, fontsize=9)
        ax.set_xlabel("judged on", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("next-day NE")
    axes[0][0].legend(fontsize=7)
    return _png(fig)


def _v(version) -> str:
    return "(none)" if version is None else f"v{version}"


def _f(value) -> str:
    return "" if value is None or value != value else f"{value:.4f}"


def days_html(report: dict[str, Any]) -> list[str]:
    rounds = _rounds(report)
    if not rounds:
        return []
    window = report["days"].get("window")
    parts = ["<h2>Daily rounds: warm starts judged on the next day</h2>",
             f"<p>training.window {html.escape(str(window))}. Round 0 is the first window (every model above was "
             "trained and tested on it); each later round brings one new day through the feature steps, continues "
             "yesterday's teacher and student on the days they have not seen, and gates the student on the new day "
             "against the champion, on the same rows.</p>"]
    rows = []
    for r in rounds:
        ne = r.get("next_day_macro_ne") or {}
        rows.append([r["round"], r["test_day"], r["warm_start"], ", ".join(d[5:] for d in r.get("trained_days") or []),
                     r.get("teacher_examples"), _v(r.get("challenger_version")), _f(ne.get("challenger")),
                     _f(ne.get("champion")), _f(ne.get("teacher")), r.get("decision"),
                     f"{_v(r.get('champion_before'))} → {_v(r.get('champion_after'))}",
                     "; ".join(r.get("failed_checks") or [])])
    parts.append(_table(rows, ["round", "judged on", "start", "new train days", "teacher examples", "challenger",
                               "next-day macro NE", "champion's", "teacher's", "decision", "champion", "failed checks"]))
    img = plot_days(report)
    if img:
        parts.append(f"<img alt='next-day NE per cell' src='data:image/png;base64,{img}'>")
    return parts
