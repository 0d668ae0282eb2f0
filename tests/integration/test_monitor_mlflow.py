"""The monitor's per-cell series in MLflow: one run, one metric per cell and figure, step = the
period's index (a real local MLflow registry: slow)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lattice.config import load_config
from lattice.monitoring.stage import monitor
from lattice.paths import Paths

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "unit"))
import test_monitoring as T  # noqa: E402  (the hand-built log and example table)


@pytest.mark.slow
def test_series_in_mlflow(tmp_path):
    from lattice.registry import ModelRegistry

    config = load_config(ROOT / "configs" / "demo.yaml")
    T._log(config, tmp_path, ["e1", "e2", "e3"], "feed", [0.8, 0.2, 0.1], T.DAY1)
    T._log(config, tmp_path, ["f1", "f2"], "feed", [0.8, 0.2], T.DAY2)
    T._examples(tmp_path, [T._ex("e1", 1), T._ex("e2", 0), T._ex("e3", 0),
                           dict(T._ex("f1", 1), date="2026-01-06"), dict(T._ex("f2", 0), date="2026-01-06")])
    paths = Paths(workdir=tmp_path, data_root=tmp_path)
    out = monitor(config, paths, mlflow=True)
    assert out["mlflow_run_id"] and "mlflow_error" not in out
    history = ModelRegistry(config, paths).client.get_metric_history(out["mlflow_run_id"], "online.feed.click.v3.calibration")
    # day 1: (.8 + .2 + .1) / 1 positive; day 2: (.8 + .2) / 1
    assert sorted((m.step, round(m.value, 9)) for m in history) == [(0, 1.1), (1, 1.0)]
