"""The MLflow registry wrapper on a real SQLite backend: logging, versions, aliases, rollback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lattice.config import load_config
from lattice.paths import Paths
from lattice.registry import CHALLENGER, CHAMPION, ModelRegistry
from lattice.registry.checksum import sha256_path
from lattice.registry.stages import register

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config():
    return load_config(ROOT / "configs" / "demo.yaml")


def _fake_model(paths: Paths, model: str, ne: float, payload: bytes) -> Path:
    d = paths.model_dir(model)
    (d / "export").mkdir(parents=True, exist_ok=True)
    (d / "export" / "model.pt").write_bytes(payload)
    (d / "export" / "metadata.json").write_text(json.dumps({"trained_at": "2026-01-15T00:00:00Z"}))
    (d / "plan.json").write_text(json.dumps({"user_id": "table_wise"}))
    (d / "history.json").write_text(json.dumps([{"epoch": 0, "train_loss": 0.5}, {"epoch": 1, "train_loss": 0.4}]))
    cells = {"feed": {"click": {"ne": ne, "auc": 0.7, "calibration": 1.0}}, "search": {"click": {"ne": ne + 0.01, "auc": 0.71}}}
    (d / "metrics.json").write_text(json.dumps({"cells": cells, "macro": {"ne": ne}}))
    return d


def test_register_promote_rollback(config, tmp_path):
    paths = Paths.for_config(config, tmp_path / "wd")
    _fake_model(paths, "teacher", 0.80, b"teacher")
    t = register(config, paths, "teacher")
    assert t["registered_model"] == "demo_ranker_teacher" and t["version"] == 1 and not t["challenger"]

    _fake_model(paths, "student", 0.81, b"student-1")
    s1 = register(config, paths, "student")
    reg = ModelRegistry(config, paths)
    v1 = reg.by_alias(CHALLENGER)
    assert v1 is not None and v1.version == s1["version"] == 1
    assert v1.tags["lattice.checksum"] == sha256_path(paths.model_dir("student") / "export")
    assert v1.tags["lattice.feature_service"]
    assert v1.tags["lattice.trained_at"] == "2026-01-15T00:00:00Z"
    run = reg.client.get_run(v1.run_id)
    assert run.data.metrics["cells.feed.click.ne"] == pytest.approx(0.81)
    assert run.data.params["promotion.max_ne_regression"] == str(config.promotion.max_ne_regression)
    arts = {a.path for a in reg.client.list_artifacts(v1.run_id)}
    assert {"model", "plots", "config"} <= arts
    plots = {a.path for a in reg.client.list_artifacts(v1.run_id, "plots")}
    assert plots == {"plots/cells.png", "plots/history.png"}

    # the downloaded artifact is byte-identical to what was registered
    local = reg.download(v1)
    assert sha256_path(local / "export") == v1.tags["lattice.checksum"]

    assert reg.by_alias(CHAMPION) is None
    assert reg.promote(v1) is None
    assert reg.by_alias(CHAMPION).version == 1 and reg.by_alias(CHALLENGER) is None

    _fake_model(paths, "student", 0.79, b"student-2")
    register(config, paths, "student")
    v2 = reg.by_alias(CHALLENGER)
    assert v2.version == 2
    assert reg.promote(v2) == 1
    assert reg.champion_history() == [1, 2]

    assert reg.rollback() == (2, 1)
    assert reg.by_alias(CHAMPION).version == 1
    assert reg.version(2).tags["lattice.rolled_back"] == "true"
    with pytest.raises(RuntimeError, match="no previous champion"):
        reg.rollback()


def test_decision_is_recorded_on_the_version(config, tmp_path):
    paths = Paths.for_config(config, tmp_path / "wd")
    _fake_model(paths, "student", 0.81, b"s")
    register(config, paths, "student")
    reg = ModelRegistry(config, paths)
    v = reg.by_alias(CHALLENGER)
    decision = {
        "decision": "reject", "passed": False, "failed_cells": ["feed/click"],
        "reasons": [{"check": "ne_vs_champion", "passed": False, "message": "feed/click: NE too high", "cell": "feed/click"}],
        "measurements": {"latency_p99_ms": 1.5},
    }
    rid = reg.log_decision(v, decision)
    tags = reg.version(v.version).tags
    assert tags["lattice.gate.decision"] == "reject" and tags["lattice.gate.run_id"] == rid
    assert json.loads(tags["lattice.gate.failed"]) == ["feed/click: NE too high"]
    assert reg.client.get_run(rid).data.metrics["latency_p99_ms"] == 1.5


def test_register_without_trained_model_says_what_to_run(config, tmp_path):
    with pytest.raises(FileNotFoundError, match="lattice train"):
        register(config, Paths.for_config(config, tmp_path / "wd"), "teacher")
