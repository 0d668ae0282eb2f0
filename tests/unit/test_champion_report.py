"""The `report` stage rewrites report.html from the model folders and the registry's champion:
after a second promotion the page names the new champion and its gate decision, and the stage
creates nothing in a work dir without a registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lattice.config import load_config
from lattice.evaluation.champion_report import report
from lattice.paths import Paths

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config():
    return load_config(ROOT / "configs" / "demo.yaml")


def _model_folder(paths: Paths, model: str, ne: float) -> None:
    folder = paths.model_dir(model)
    folder.mkdir(parents=True)
    cells = {"feed/click": {"ne": ne, "auc": 0.7, "calibration": 1.01}}
    (folder / "metrics.json").write_text(json.dumps({"cells": cells, "macro": {"ne": ne}, "by_objective": {"click": {"ne": ne}}}))


def test_without_registry_reports_the_models_and_creates_no_registry(config, tmp_path):
    paths = Paths(workdir=tmp_path, data_root=ROOT)
    _model_folder(paths, "student", 0.8123)
    (tmp_path / "report.html").write_text("old page of v1")
    summary = report(config, paths)
    page = (tmp_path / "report.html").read_text()
    assert "old page" not in page and "0.8123" in page
    assert summary["champion_version"] is None and summary["models"] == ["student"]
    assert json.loads((tmp_path / "report.json").read_text())["models"]["student"]["macro"] == {"ne": 0.8123}
    assert not paths.mlflow.exists()  # read-only: no registry appears
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models", "report.html", "report.json"]  # no temp file left


def test_missing_models_folder_is_a_clear_error(config, tmp_path):
    with pytest.raises(FileNotFoundError, match="run the training stages"):
        report(config, Paths(workdir=tmp_path, data_root=ROOT))


@pytest.mark.slow  # creates a local MLflow registry (its schema migrations take ~15 s here)
def test_report_follows_the_champion(config, tmp_path):
    from lattice.registry.client import ModelRegistry

    paths = Paths(workdir=tmp_path, data_root=ROOT)
    _model_folder(paths, "student", 0.8)
    reg = ModelRegistry(config, paths)
    reg.client.create_registered_model(reg.base_name)
    versions = []
    for _ in range(2):
        run = reg.client.create_run(reg.experiment_id, tags={"lattice.model": "student"})
        mv = reg.client.create_model_version(reg.base_name, run.info.artifact_uri, run.info.run_id,
                                             tags={"lattice.model": "student"})
        versions.append(reg.version(int(mv.version)))
    for before, v in ((None, versions[0]), (1, versions[1])):
        reasons = [{"check": "ne", "passed": True, "message": f"v{v.version} ok"}]
        decision = {"decision": "promote", "passed": True, "reasons": reasons,
                    "challenger_version": v.version, "champion_before": before, "champion_after": v.version, "measurements": {}}
        # bare version records without artifacts: the report reads only the registry's records
        gate_run = reg.record_promotion(v, decision, verify_stored=False)
    summary = report(config, paths)
    assert summary["champion_version"] == 2 and summary["gate_run_id"] == gate_run
    assert summary["run_id"] == versions[1].run_id
    page = (tmp_path / "report.html").read_text()
    assert "champion v1 → v2, challenger v2" in page and "v2 ok" in page
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["champion"]["history"] == [1, 2]
    # the stage's summary is what the run note is made from: it links the champion's run and the page
    from lattice.orchestration.links import links_for

    links = links_for(summary, config, paths)
    assert links["MLflow gate decision"] == f"{paths.mlflow} (run {gate_run})"
    assert links["report"] == str(tmp_path / "report.html")
    assert links["per-cell test metrics"] == str(paths.model_dir("student") / "metrics.json")
