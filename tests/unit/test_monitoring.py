"""The monitor stage on a hand-built prediction log and example table: the label join, the
per-cell figures against the same figures computed by hand, masked labels, drift, the report."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lattice.config import load_config
from lattice.config.monitoring import CalibrationRule, Monitoring
from lattice.monitoring.cells import psi
from lattice.monitoring.records import LogSchema, log_dir, record_batch, write_partitioned
from lattice.monitoring.stage import monitor
from lattice.paths import Paths

ROOT = Path(__file__).resolve().parents[2]
DAY1 = pd.Timestamp("2026-01-05T13:00Z").timestamp()
DAY2 = pd.Timestamp("2026-01-06T09:00Z").timestamp()


@pytest.fixture(scope="module")
def config():
    return load_config(ROOT / "configs" / "demo.yaml")


def _log(config, workdir: Path, ids: list[str], domain: str, p_click: list[float], when: float, version: int = 3,
         price: list[float] | None = None, passthrough: dict | None = None, cfg_schema=None, fmt: str = "parquet") -> None:
    schema = cfg_schema or LogSchema(config)
    n = len(ids)
    ones = (np.arange(n, dtype=np.int64), np.ones(n, bool))
    table = record_batch(
        schema, request_id=ids, logged_at=when, origin="serve", domain=[domain] * n, model_version=version,
        entities={"user_id": ones, "ad_id": ones}, passthrough=passthrough or {},
        probabilities={"click": np.array(p_click), "conversion": np.full(n, 0.01)}, unknown=[[]] * n,
        store_error=False, sparse={}, dense={"price": np.array(price if price is not None else [1.0] * n)})
    write_partitioned(table, log_dir(workdir), fmt=fmt)


def _examples(workdir: Path, rows: list[dict]) -> None:
    frame = pd.DataFrame(rows)
    for (date, domain), g in frame.groupby(["date", "domain"]):
        folder = workdir / "consolidated" / f"date={date}" / f"domain={domain}"
        folder.mkdir(parents=True, exist_ok=True)
        g.drop(columns=["date", "domain"]).to_parquet(folder / "part-0.parquet", index=False)


def _ex(eid: str, click: int, mask: int = 1, split: str = "test", price: float = 1.0, **extra) -> dict:
    return {"example_id": eid, "date": "2026-01-05", "domain": "feed", "split": split, "price": price,
            "price_present": 1, "label_click": click, "mask_click": mask, "label_conversion": 0,
            "mask_conversion": 1, **extra}


def test_label_join_gives_the_hand_computed_figures(config, tmp_path):
    p = [0.8, 0.2, 0.1, 0.5, 0.9, 0.3]
    # as serving writes them: Arrow parts, which the monitor compacts into parquet before it reads
    _log(config, tmp_path, ["e1", "e2", "e3"], "feed", p[:3], DAY1, fmt="arrow")
    _log(config, tmp_path, ["e4", "e5", "e6"], "feed", p[3:], DAY1, fmt="arrow")
    # e5's click window is still open (mask 0): not a negative; e6 has not arrived: pending
    _examples(tmp_path, [_ex("e1", 1), _ex("e2", 0), _ex("e3", 0), _ex("e4", 1), _ex("e5", 0, mask=0)])
    out = monitor(config, Paths(workdir=tmp_path, data_root=tmp_path), mlflow=False)
    cells = pd.read_parquet(tmp_path / "monitoring" / "metrics.parquet")
    click = cells[(cells["objective"] == "click")].iloc[0]
    # by hand, over e1..e4: y = 1 0 0 1, p = .8 .2 .1 .5
    log_loss = -(math.log(0.8) + math.log(0.8) + math.log(0.9) + math.log(0.5)) / 4
    assert click["count"] == 4 and click["positives"] == 2 and click["logged"] == 6 and click["pending"] == 1
    assert click["calibration"] == pytest.approx((0.8 + 0.2 + 0.1 + 0.5) / 2, rel=1e-12)  # float sums in another order
    assert click["ne"] == pytest.approx(log_loss / math.log(2), rel=1e-12)
    assert click["auc"] == 1.0  # both positives (.8, .5) outrank both negatives (.2, .1)
    assert click["prediction_mean"] == pytest.approx(0.4, rel=1e-12)
    assert click["label_rate"] == 0.5
    assert (click["domain"], click["model_version"], click["period"]) == ("feed", 3, "2026-01-05")
    assert out["rows"] == {"logged": 6, "joined": 5, "pending": 1}
    assert out["compacted"] == {"folders": 1, "parts": 2, "rows": 6}
    assert not list(log_dir(tmp_path).rglob("*.arrow")) and len(list(log_dir(tmp_path).rglob("compact-*.parquet"))) == 1
    assert (tmp_path / "monitoring" / "report.html").read_text().count("<img") == 1
    # video carries no conversion label: no (video, conversion) cell; feed carries both
    assert set(cells["objective"]) == {"click", "conversion"}


def test_passthrough_keys_join_when_sent(config, tmp_path):
    src = config.sources[0].model_copy(update={"passthrough": ["imp"]})
    cfg = config.model_copy(update={"sources": [src, *config.sources[1:]]})
    _log(cfg, tmp_path, ["x1", "x2"], "feed", [0.6, 0.2], DAY1, passthrough={"imp": ["i-1", None]})
    # x1 joins by its impression id (its request id is not an example id); x2 by its request id
    _examples(tmp_path, [_ex("zzz", 1, imp="i-1"), _ex("x2", 1, imp="i-2")])
    monitor(cfg, Paths(workdir=tmp_path, data_root=tmp_path), mlflow=False)
    click = pd.read_parquet(tmp_path / "monitoring" / "metrics.parquet").query("objective == 'click'").iloc[0]
    assert click["count"] == 2 and click["positives"] == 2
    assert click["calibration"] == pytest.approx(0.8 / 2, rel=1e-12)


def test_psi_is_zero_on_the_same_data_and_large_on_a_shift():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=20_000)
    assert psi(ref, rng.normal(size=20_000)) < 0.01
    assert psi(ref, rng.normal(loc=1.0, size=20_000)) > 0.25
    # a feature that stops being sent is drift too (its own bin)
    assert psi(ref, np.full(1000, np.nan)) > 1.0


def test_stage_trips_a_calibration_rule_and_reports_drift(config, tmp_path):
    mon = Monitoring(rules=[CalibrationRule(kind="calibration", low=0.9, high=1.1, min_positives=2, periods=2)])
    cfg = config.model_copy(update={"monitoring": mon})
    # two days of over-prediction: p = 0.9 where half the labels are positive (calibration 1.8)
    rows = []
    for day, when in (("2026-01-05", DAY1), ("2026-01-06", DAY2)):
        ids = [f"{day}-{i}" for i in range(4)]
        _log(cfg, tmp_path, ids, "feed", [0.9] * 4, when, price=[50.0] * 4)
        rows += [dict(_ex(e, i % 2), date=day) for i, e in enumerate(ids)]
    rows += [dict(_ex(f"t{i}", 0, split="train", price=float(i % 5)), date="2026-01-01") for i in range(50)]
    _examples(tmp_path, rows)
    out = monitor(cfg, Paths(workdir=tmp_path, data_root=tmp_path), mlflow=False)
    assert [(t["kind"], t["domain"], t["objective"]) for t in out["tripped"]] == [("calibration", "feed", "click")]
    assert out["tripped"][0]["figures"]["calibration"] == [1.8, 1.8]
    psi_rows = [d for d in out["drift"] if d["feature"] == "price"]
    assert len(psi_rows) == 2 and all(d["psi"] > 1.0 for d in psi_rows)  # served 50 where training saw 0..4
    # run again on the same data: the same finding is not reported twice
    again = monitor(cfg, Paths(workdir=tmp_path, data_root=tmp_path), mlflow=False)
    assert again["tripped"] == [] and again["suppressed"] == 1


def test_an_open_attribution_window_is_masked_at_the_monitors_end(tmp_path):
    """The consolidated table keeps the final labels (a conversion logged days later included): at
    the monitor's end an impression whose 7-day window is still open is neither a negative nor a
    positive; once the window has closed its final label counts."""
    cfg = load_config(ROOT / "bench" / "configs" / "demo_market.yaml")
    _log(cfg, tmp_path, ["a", "b", "c"], "feed", [0.5, 0.5, 0.5], DAY1)
    at = pd.Timestamp(DAY1, unit="s", tz="UTC")
    rows = [dict(_ex(e, 1), label_conversion=conv, event_timestamp=at,
                 known_conversion=at + pd.Timedelta(days=3) if conv else pd.NaT) for e, conv in (("a", 1), ("b", 0), ("c", 0))]
    _examples(tmp_path, rows)
    paths = Paths(workdir=tmp_path, data_root=tmp_path)

    def conversion(end: str) -> dict:
        out = monitor(cfg, paths, end=end, mlflow=False)
        return next(c for c in out["cells"] if c["objective"] == "conversion")

    early = conversion("2026-01-07")  # two days on: every window open
    assert early["count"] == 0 and early["positives"] == 0
    late = conversion("2026-01-13")  # 7 days after 13:00 on the 5th have passed
    assert late["count"] == 3 and late["positives"] == 1
    click = next(c for c in monitor(cfg, paths, end="2026-01-07", mlflow=False)["cells"] if c["objective"] == "click")
    assert click["count"] == 3  # no attribution window: known at once
