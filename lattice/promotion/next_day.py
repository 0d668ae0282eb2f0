"""Next-day judgment: a windowed challenger is gated on the first day after its training window
(its lineage's `judged_on`, copied into the registry tag `lattice.lineage.judged_on`), against the
champion on the same rows; each gate's per-cell NE, AUC and calibration of both are MLflow metric
series with step = the day's index (days since `time_range.start`), in the decision run and in
one `next_day` run per config that collects the days in one place."""

from __future__ import annotations

import datetime as dt

from lattice.config import PlatformConfig
from lattice.promotion.gate import Cell, CellMetrics

JUDGED_TAG = "lattice.lineage.judged_on"
SERIES_RUN = "next_day"


def judged_day(tags: dict[str, str]) -> str | None:
    """The challenger's next day (None: it was trained on the whole table, judged on its test split)."""
    return tags.get(JUDGED_TAG) or None


def day_index(config: PlatformConfig, day: str) -> int:
    return (dt.date.fromisoformat(day) - config.time_range.start).days


def series(config: PlatformConfig, day: str, cells: dict[str, dict[Cell, CellMetrics] | None]) -> dict[str, list]:
    """{"next_day.<role>.<domain>.<objective>.<ne|auc|calibration>": [value, step]} of each role's cells."""
    step = day_index(config, day)
    out: dict[str, list] = {}
    for role, by_cell in cells.items():
        for (d, o), m in (by_cell or {}).items():
            for name in ("ne", "auc", "calibration"):
                v = getattr(m, name)
                if v == v:
                    out[f"next_day.{role}.{d}.{o}.{name}"] = [float(v), step]
    return out


def log_series(reg, values: dict[str, list]) -> str | None:
    """Append the points to the config's `next_day` run (created on first use); returns its id."""
    if not values:
        return None
    client = reg.client
    found = client.search_runs([reg.experiment_id], filter_string=f"tags.`lattice.model` = '{SERIES_RUN}'", max_results=1)
    rid = found[0].info.run_id if found else client.create_run(reg.experiment_id, run_name=SERIES_RUN,
                                                                tags={"lattice.model": SERIES_RUN}).info.run_id
    for k, (v, step) in sorted(values.items()):
        client.log_metric(rid, k, v, step=int(step))
    return rid
