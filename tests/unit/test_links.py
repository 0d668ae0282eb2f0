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


def test_extra_links_read_the_tasks_own_result_and_only_offer_what_opens(tmp_path: Path) -> None:
    """The Airflow extra link of a name: the URL as it is, an existing file as a file:// URI, and
    nothing for a local MLflow run id (no page to open) or a name the result does not have."""
    from lattice.orchestration.airflow_links import ResultLink, links_for_stages

    report = tmp_path / "report.html"
    report.write_text("<html></html>")

    class FakeTI:  # what Airflow 3 passes as ti_key when the task ends: the running task instance
        task_id = "refresh_report"

        def xcom_pull(self, task_ids, key):
            assert (task_ids, key) == ("refresh_report", "return_value")
            return {"links": {"report": str(report), "MLflow run": f"{tmp_path} (run abc)",
                              "MLflow gate decision": "http://127.0.0.1:5055/#/runs/g1"}}

    ti = FakeTI()
    assert ResultLink("report").get_link(None, ti_key=ti) == report.resolve().as_uri()
    assert ResultLink("MLflow gate decision").get_link(None, ti_key=ti) == "http://127.0.0.1:5055/#/runs/g1"
    assert ResultLink("MLflow run").get_link(None, ti_key=ti) == ""
    assert ResultLink("monitoring report").get_link(None, ti_key=ti) == ""
    assert ResultLink("per-cell test metrics").xcom_key == "_link_lattice_per_cell_test_metrics"
    assert [link.name for link in links_for_stages(["register"])] == ["MLflow run", "MLflow model version", "per-cell test metrics"]
    assert links_for_stages(["materialize"]) == ()


def test_every_stage_link_name_is_one_links_for_can_give(tmp_path: Path) -> None:
    """A stage's link that links_for never names would be a button that never opens anything."""
    import inspect

    from lattice.orchestration import links as module
    from lattice.orchestration.links import STAGE_LINKS

    source = inspect.getsource(module.links_for) + repr(module.RUN_KEYS)
    for stage, names in STAGE_LINKS.items():
        for name in names:
            assert f'"{name}"' in source or f"'{name}'" in source, (stage, name)
