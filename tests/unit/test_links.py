"""Run-note links from a task's summary: MLflow UI pages with a tracking server, the local
registry folder and run id without one, and only the report files that exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from lattice.config import load_config
from lattice.orchestration.links import links_for, run_note
from lattice.paths import Paths

ROOT = Path(__file__).resolve().parents[2]
REGISTER = {"model": "student", "registered_model": "lattice-demo", "version": 3, "run_id": "abc123"}


@pytest.fixture(scope="module")
def config():
    return load_config(ROOT / "configs" / "demo.yaml")


def _server(config, uri: str):
    return config.model_copy(update={"registry": config.registry.model_copy(update={"tracking_uri": uri})})


def test_tracking_server_gives_ui_urls(config, tmp_path):
    paths = Paths(workdir=tmp_path, data_root=ROOT)
    links = links_for(REGISTER, _server(config, "http://127.0.0.1:5055/"), paths)
    assert links == {"MLflow run": "http://127.0.0.1:5055/#/runs/abc123",
                     "MLflow model version": "http://127.0.0.1:5055/#/models/lattice-demo/versions/3"}
    # the summary's own tracking URI (the registry the task really used) wins over the config
    gate = {"gate_run_id": "g1", "tracking_uri": "https://mlflow.example"}
    assert links_for(gate, config, paths) == {"MLflow gate decision": "https://mlflow.example/#/runs/g1"}


def test_local_registry_gives_paths_and_existing_files_only(config, tmp_path):
    paths = Paths(workdir=tmp_path, data_root=ROOT)
    assert links_for(REGISTER, config, paths) == {"MLflow run": f"{tmp_path / 'mlflow'} (run abc123)"}
    (tmp_path / "report.html").write_text("<html></html>")
    paths.model_dir("student").mkdir(parents=True)
    (paths.model_dir("student") / "metrics.json").write_text("{}")
    links = links_for(REGISTER, config, paths)
    assert links["report"] == str(tmp_path / "report.html")
    assert links["per-cell test metrics"] == str(paths.model_dir("student") / "metrics.json")
    assert "monitoring report" not in links


def test_monitor_summary_links_its_report_series_and_metrics(config, tmp_path):
    paths = Paths(workdir=tmp_path, data_root=ROOT)
    mon = tmp_path / "monitoring"
    mon.mkdir()
    (mon / "report.html").write_text("<html></html>")
    summary = {"stage": "monitor", "report": str(mon / "report.html"), "metrics": str(mon / "metrics.parquet"),
               "mlflow_run_id": "m9"}
    links = links_for(summary, _server(config, "http://mlflow:5000"), paths)
    assert links == {"MLflow monitoring series": "http://mlflow:5000/#/runs/m9",
                     "monitoring report": str(mon / "report.html"),
                     "per-cell online metrics": str(mon / "metrics.parquet")}
    note = run_note(links, "monitor 2026-12-04")
    assert note.splitlines() == ["**monitor 2026-12-04**", "",
                                 "- [MLflow monitoring series](http://mlflow:5000/#/runs/m9)",
                                 f"- monitoring report: `{mon / 'report.html'}`",
                                 f"- per-cell online metrics: `{mon / 'metrics.parquet'}`"]
    assert run_note({}) == "- no MLflow run or report for this run"
