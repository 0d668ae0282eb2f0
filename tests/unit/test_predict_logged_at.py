"""`lattice predict --logged-at`: a replayed day's scores land in that day's log partition and
monitor period, not in the replay's (the scorer, the parser and the online store are stubbed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lattice.config import load_config
from lattice.data import schema as S
from lattice.monitoring.join import read_log
from lattice.paths import Paths

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def stubbed(monkeypatch, tmp_path):
    import lattice.scoring.batch as batch
    import pipelines.score_input as score_input

    config = load_config(ROOT / "configs" / "demo.yaml")
    n = 4
    good = pd.DataFrame({"example_id": [f"e{i}" for i in range(n)], "domain": ["feed"] * n,
                         "event_timestamp": pd.Timestamp("2026-01-03T10:00Z"),
                         "user_id": np.arange(n, dtype=np.int64), "ad_id": np.arange(n, dtype=np.int64)})
    for c in S.passthrough_columns(config):
        good[c] = None

    class Src:
        name = "feed_log"

    monkeypatch.setattr(score_input, "parse_input", lambda *a, **k: (good, pd.DataFrame(), Src()))
    monkeypatch.setattr(batch, "_scorer", lambda *a, **k: (lambda f: {o: np.full(len(f), 0.25) for o in config.objective_names},
                                                           "stub", 7))
    monkeypatch.setattr(batch, "_online_aggregates", lambda c, p, rows: ({}, [[] for _ in range(len(rows))]))
    return batch, config, Paths.for_config(config, tmp_path / "work")


def test_logged_at_places_the_scores_in_the_replayed_day(stubbed, tmp_path):
    batch, config, paths = stubbed
    out = batch.predict_file(config, paths, "unused", str(tmp_path / "p.parquet"), logged_at="2026-01-03T12:00")
    assert out["logged"] == 4
    log = read_log(paths.workdir)
    assert (log["logged_at"] == pd.Timestamp("2026-01-03T12:00Z")).all()
    assert [p.name for p in (paths.workdir / "prediction_log").iterdir()] == ["hour=2026-01-03T12"]


def test_without_logged_at_the_scores_are_logged_now(stubbed, tmp_path):
    batch, config, paths = stubbed
    before = pd.Timestamp.now(tz="UTC")
    batch.predict_file(config, paths, "unused", str(tmp_path / "p.parquet"))
    log = read_log(paths.workdir)
    assert (log["logged_at"] >= before.floor("s")).all()
