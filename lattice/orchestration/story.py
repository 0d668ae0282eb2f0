"""The closing lines of a task's log: what a person reads first, from the stage's summary."""

from __future__ import annotations

from typing import Any


def _numbers(value: Any, prefix: str = "", limit: int = 6) -> list[str]:
    """`path=value` of the first numeric leaves of a nested dict (a stage's metrics)."""
    out: list[str] = []
    if isinstance(value, dict):
        for key, inner in value.items():
            out += _numbers(inner, f"{prefix}{key}.", limit - len(out))
            if len(out) >= limit:
                break
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out.append(f"{prefix.rstrip('.')}={value:.4g}" if isinstance(value, float) else f"{prefix.rstrip('.')}={value}")
    return out[:limit]


def summary_lines(summary: Any) -> list[str]:
    """The few lines a person reads first: rows in / out / quarantined, the model, its metrics,
    the decision. Each is there only when the stage's summary has it (names shared by stages)."""
    if not isinstance(summary, dict):
        return []
    lines = []
    totals = summary.get("totals") if isinstance(summary.get("totals"), dict) else summary
    rows = [f"{k.replace('_', ' ')} {totals[k]}" for k in ("rows_in", "rows_out", "quarantined", "skipped", "rows")
            if isinstance(totals.get(k), int) and not isinstance(totals.get(k), bool)]
    if rows:
        lines.append("rows: " + ", ".join(rows))
    model = [f"{k.replace('_', ' ')} {summary[k]}" for k in ("model", "registered_model", "version", "challenger_version",
                                                          "from_version", "to_version")
             if isinstance(summary.get(k), (str, int)) and not isinstance(summary.get(k), bool)]
    if model:
        lines.append("model: " + ", ".join(model))
    if metrics := _numbers(summary.get("metrics")):
        lines.append("metrics: " + ", ".join(metrics))
    decision = [f"{k.replace('_', ' ')} {summary[k]}" for k in ("decision", "promoted", "champion_after", "dry_run", "status")
                if isinstance(summary.get(k), (str, int, bool))]
    if decision:
        lines.append("decision: " + ", ".join(decision))
    return lines
