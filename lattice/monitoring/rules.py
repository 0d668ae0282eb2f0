"""`monitoring.rules` over the per-cell series: which rule trips, in which cell, on which figures.

`check` is pure: series in, findings out. Each rule watches the series of the latest model
version serving the cell (a retrained model is judged on its own periods), and a period counts
only when it had enough positive labels. `decide` then applies the memory kept in
`<workdir>/monitoring/rules_state.json`:
- de-duplication: a finding already reported for the same last period is not reported again;
- cooldown: a rule and cell reported less than `cooldown_hours` ago (in data time: between the
  starts of the last periods) is not reported again;
- a rule that trips again once a newer model version serves the cell (the retrain it triggered
  did not help) is flagged `needs_person` and not retriggered; the flag clears when the rule stops
  tripping for that cell;
- unless the model that tripped was back within bounds on a later period before the newer one
  served (`recovered`): the episode had ended, so the newer model's trip is a new one (under the
  cooldown), not a retrain that failed. A shock that lands on a retrain triggered by an earlier,
  passing miscalibration then starts its own retrain instead of waiting for a person
  (bench/bench_market_life.py, part C, seed 42 with `training.window_validation: 0.5`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import NormalDist
from typing import Any

import pandas as pd

from lattice.config.monitoring import CalibrationRule, DriftRule, NeRegressionRule
from lattice.evaluation.metrics import calibration_interval

PERIOD_HOURS = {"hour": 1.0, "day": 24.0}


def _consecutive(periods: list[pd.Timestamp], period: str) -> bool:
    step = pd.Timedelta(hours=PERIOD_HOURS[period])
    return all(b - a == step for a, b in zip(periods, periods[1:]))


def _latest_version(series: pd.DataFrame) -> pd.DataFrame:
    latest = series["model_version"].max()
    return series[series["model_version"] == latest].sort_values("period_start")


def _tail(series: pd.DataFrame, k: int, period: str) -> pd.DataFrame | None:
    """The last k rows if they are k consecutive periods, else None."""
    if len(series) < k:
        return None
    tail = series.iloc[-k:]
    return tail if _consecutive(list(tail["period_start"]), period) else None


def _finding(index: int, rule, cell: dict, tail: pd.DataFrame, figure: str, bounds: dict, reason: str) -> dict:
    return {
        "rule": index, "kind": rule.kind, **cell, "model_version": int(tail["model_version"].iloc[-1]),
        "periods": list(tail["period"]), "last_period": str(tail["period"].iloc[-1]),
        "last_period_start": str(tail["period_start"].iloc[-1]),
        "figures": {figure: [round(float(v), 6) for v in tail[figure]],
                    **({"positives": [int(v) for v in tail["positives"]]} if "positives" in tail else {})},
        "bounds": bounds, "reason": reason,
    }


def _healthy(index: int, rule, domain: str, cell: str, s: pd.DataFrame, bad: pd.Series) -> dict | None:
    """The cell's last counted period was within the rule's bounds."""
    if len(s) and not bool(bad.iloc[-1]):
        return {"key": f"{index}:{rule.kind}:{domain}:{cell}", "model_version": int(s["model_version"].iloc[-1]),
                "last_period_start": str(s["period_start"].iloc[-1])}
    return None


def calibration_bounds(rule: CalibrationRule, s: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per period, (low, high) of the calibration's `rule.confidence` interval; rows without the
    positive count's sums (a series written before they were kept) give the point estimate."""
    z = NormalDist().inv_cdf(0.5 + rule.confidence / 2) if rule.confidence > 0 else 0.0
    nan = pd.Series(float("nan"), index=s.index)
    expected, variance = s.get("expected_positives", nan), s.get("positives_variance", nan)
    pairs = [calibration_interval(float(c), float(e), float(n), float(v), z)
             for c, e, n, v in zip(s["calibration"], expected, s["positives"], variance)]
    return (pd.Series([a for a, _ in pairs], index=s.index, dtype=float),
            pd.Series([b for _, b in pairs], index=s.index, dtype=float))


def _pooled_calibration(index: int, rule: CalibrationRule, cells: pd.DataFrame, period: str) -> list[dict]:
    """`rule.pooled`: one interval over the sums of the last `periods` consecutive periods."""
    out = []
    z = NormalDist().inv_cdf(0.5 + rule.confidence / 2) if rule.confidence > 0 else 0.0
    for (domain, objective), series in cells.groupby(["domain", "objective"], sort=True):
        s = _latest_version(series)
        s = s[(s["positives"] > 0) & s["calibration"].notna()]
        tail = _tail(s, rule.periods, period)
        if tail is None:
            continue
        positives = float(tail["positives"].sum())
        if positives < rule.min_positives:
            continue
        nan = pd.Series(float("nan"), index=tail.index)
        expected_each = tail.get("expected_positives", nan).fillna(tail["calibration"] * tail["positives"])
        expected, variance = float(expected_each.sum()), float(tail.get("positives_variance", nan).sum(min_count=len(tail)))
        cal = expected / positives
        low, high = calibration_interval(cal, expected, positives, variance, z)
        key = {"key": f"{index}:{rule.kind}:{domain}:{objective}", "model_version": int(tail["model_version"].iloc[-1])}
        if not (high < rule.low or low > rule.high):
            out.append(key)
            continue
        f = _finding(index, rule, {"domain": domain, "objective": objective}, tail, "calibration",
                     {"low": rule.low, "high": rule.high, "min_positives": rule.min_positives,
                      "confidence": rule.confidence, "pooled": True},
                     f"calibration over the last {rule.periods} period(s) pooled ({cal:.3f} over {positives:.0f} positives) "
                     f"outside [{rule.low}, {rule.high}]" + (f" beyond noise ({100 * rule.confidence:g}% interval)" if z else ""))
        f["figures"]["pooled"] = {"calibration": round(cal, 6), "positives": int(positives),
                                  "interval": [round(float(low), 6), round(float(high), 6)]}
        out.append(f)
    return out


def _calibration(index: int, rule: CalibrationRule, cells: pd.DataFrame, period: str) -> list[dict]:
    if rule.pooled:
        return _pooled_calibration(index, rule, cells, period)
    out = []
    beyond = f" beyond noise ({100 * rule.confidence:g}% interval)" if rule.confidence > 0 else ""
    for (domain, objective), series in cells.groupby(["domain", "objective"], sort=True):
        s = _latest_version(series)
        s = s[(s["positives"] >= rule.min_positives) & s["calibration"].notna()]
        low, high = calibration_bounds(rule, s)
        # outside: the whole interval lies below `low` or above `high`
        bad = (high < rule.low) | (low > rule.high)
        out.append(_healthy(index, rule, domain, objective, s, bad))
        tail = _tail(s, rule.periods, period)
        if tail is None:
            continue
        if bad.loc[tail.index].all():
            f = _finding(index, rule, {"domain": domain, "objective": objective}, tail, "calibration",
                         {"low": rule.low, "high": rule.high, "min_positives": rule.min_positives,
                          "confidence": rule.confidence},
                         f"calibration outside [{rule.low}, {rule.high}]{beyond} for {rule.periods} period(s) in a row")
            f["figures"]["interval"] = [[round(float(a), 6), round(float(b), 6)]
                                        for a, b in zip(low.loc[tail.index], high.loc[tail.index])]
            out.append(f)
    return out


def _ne_regression(index: int, rule: NeRegressionRule, cells: pd.DataFrame, period: str) -> list[dict]:
    out = []
    for (domain, objective), series in cells.groupby(["domain", "objective"], sort=True):
        s = _latest_version(series)
        s = s[(s["positives"] >= rule.min_positives) & s["ne"].notna()]
        if len(s) < rule.periods + 1:  # the first qualifying period is the reference
            continue
        reference = float(s["ne"].iloc[0])
        bound = reference * (1 + rule.max_increase)
        out.append(_healthy(index, rule, domain, objective, s, s["ne"] > bound))
        tail = _tail(s.iloc[1:], rule.periods, period)
        if tail is None:
            continue
        if (tail["ne"] > bound).all():
            out.append(_finding(index, rule, {"domain": domain, "objective": objective}, tail, "ne",
                                {"reference_ne": round(reference, 6), "max_ne": round(bound, 6)},
                                f"online NE above {bound:.4f} (reference {reference:.4f} + {rule.max_increase:.0%}) "
                                f"for {rule.periods} period(s) in a row"))
    return out


def _drift(index: int, rule: DriftRule, drift: pd.DataFrame, period: str) -> list[dict]:
    out = []
    if drift.empty:
        return out
    rows = drift if rule.feature == "*" else drift[drift["feature"] == rule.feature]
    for (domain, feature), series in rows.groupby(["domain", "feature"], sort=True):
        s = series[series["psi"].notna()].sort_values("period_start")
        out.append(_healthy(index, rule, domain, feature, s, s["psi"] > rule.max_psi))
        tail = _tail(s, rule.periods, period)
        if tail is None:
            continue
        if (tail["psi"] > rule.max_psi).all():
            out.append(_finding(index, rule, {"domain": domain, "feature": feature}, tail, "psi",
                                {"max_psi": rule.max_psi},
                                f"PSI of {feature} above {rule.max_psi} for {rule.periods} period(s) in a row"))
    return out


def check(rules: list, cells: pd.DataFrame, drift: pd.DataFrame, period: str = "day") -> tuple[list[dict], list[dict]]:
    """-> (every rule's findings, the rule cells whose last counted period was within bounds).
    Pure: no state, no clock."""
    found: list[dict] = []
    for i, rule in enumerate(rules):
        if isinstance(rule, DriftRule):
            found += _drift(i, rule, drift, period)
        elif cells.empty:
            continue
        elif isinstance(rule, CalibrationRule):
            found += _calibration(i, rule, cells, period)
        elif isinstance(rule, NeRegressionRule):
            found += _ne_regression(i, rule, cells, period)
    findings = [f for f in found if f is not None and "reason" in f]
    healthy = [f for f in found if f is not None and "reason" not in f]
    return findings, healthy


def finding_key(f: dict) -> str:
    cell = f.get("objective") or f.get("feature")
    return f"{f['rule']}:{f['kind']}:{f['domain']}:{cell}"


def decide(findings: list[dict], healthy: list[dict], state: dict[str, Any], cooldown_hours: float
           ) -> tuple[list[dict], list[dict], dict]:
    """-> (tripped: findings to act on, needs_person: findings a retrain did not fix, new state).

    A finding neither tripped nor flagged was suppressed (already reported, or in its cooldown).
    `healthy` (from `check`) clears a cell's memory once a newer model than the one that tripped
    serves it within bounds (the retrain worked), or once a flagged cell is within bounds."""
    keys = dict(state.get("keys", {}))
    for h in healthy:
        prev = keys.get(h["key"])
        if prev is not None and (prev.get("needs_person") or h["model_version"] > prev["model_version"]):
            del keys[h["key"]]
        elif (prev is not None and h["model_version"] == prev["model_version"] and "last_period_start" in h
              and pd.Timestamp(h["last_period_start"]) > pd.Timestamp(prev["last_tripped_at"])):
            keys[h["key"]] = {**prev, "recovered": True}  # the episode ended; the cooldown stays
    tripped, needs_person = [], []
    for f in findings:
        key = finding_key(f)
        now = pd.Timestamp(f["last_period_start"])
        prev = keys.get(key)
        if prev is None:
            keys[key] = {"first_tripped": f["last_period"], "last_period": f["last_period"],
                         "last_tripped_at": str(now), "model_version": f["model_version"], "needs_person": False, "times": 1}
            tripped.append(f)
            continue
        if prev.get("needs_person"):
            needs_person.append({**f, "needs_person": True})
            continue
        if f["model_version"] > prev["model_version"] and not prev.get("recovered"):
            # the rule tripped, a retrain was served, and it trips again: a person looks at it
            keys[key] = {**prev, "needs_person": True, "last_period": f["last_period"], "retrained_to": f["model_version"]}
            needs_person.append({**f, "needs_person": True})
            continue
        if f["last_period"] == prev["last_period"]:
            continue  # de-duplication: this very finding was reported
        since = (now - pd.Timestamp(prev["last_tripped_at"])) / pd.Timedelta(hours=1)
        if since < cooldown_hours:
            continue  # cooldown: a retrain it triggered may still be on its way
        keys[key] = {**prev, "last_period": f["last_period"], "last_tripped_at": str(now), "times": prev["times"] + 1,
                     "model_version": f["model_version"], "recovered": False}
        tripped.append(f)
    return tripped, needs_person, {"keys": keys}


def load_state(path: Path) -> dict:
    if not path.exists():
        return {"keys": {}}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the rules' state ({exc}); delete the file to start the rules' memory afresh") from exc


def save_state(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True, default=_plain))
    tmp.replace(path)


def _plain(v):
    if isinstance(v, float) and math.isnan(v):
        return None
    return str(v)
