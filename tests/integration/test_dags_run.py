"""The generated DAGs run for real with `dag.test()` (in-process, SQLite metadata DB) on a tiny copy
of the demo config: the whole chain features -> teacher -> distill -> promote, a config with an
added domain and objective, and a missing stage failing its task loudly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lattice.orchestration.airflow_env import apply_local_airflow_env, process_test_home
from tiny_dags import write_tiny_config

ROOT = Path(__file__).resolve().parents[2]
apply_local_airflow_env(process_test_home())  # before Airflow is imported anywhere in this process

FEATURES = ["synth", "consolidate", "aggregates", "feast_apply", "training_set", "materialize"]
SPARK_TASK = "consolidate_to_materialize"  # the features DAG's Spark steps, one task
CHAIN = [*FEATURES, "train", "evaluate", "register", "distill", "export", "gate", "apply_gate"]
ROWS = 6000

pytestmark = pytest.mark.slow


def _missing(names: list[str]) -> list[str]:
    from lattice import stages

    return [n for n in names if n not in stages.STAGES]


@pytest.fixture(scope="module")
def airflow_db():
    from airflow.utils import db

    db.initdb()


def _dags(monkeypatch, configs: Path, retries: int = 0) -> dict:
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("LATTICE_CONFIGS_DIR", str(configs))
    # a failing task fails the run now, not after back-off (read when the DAG file is parsed;
    # monkeypatch keeps it out of the other test modules)
    monkeypatch.setenv("LATTICE_AIRFLOW_RETRIES", str(retries))
    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert bag.import_errors == {}
    return bag.dags


def _states(dr) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}


def _xcom(dr, task_id: str, key: str = "return_value") -> dict:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        query = XComModel.get_many(run_id=dr.run_id, dag_ids=dr.dag_id, task_ids=task_id, key=key)
        row = session.scalars(query).first()
        assert row is not None, f"no result from {dr.dag_id}.{task_id}"
        return XComModel.deserialize_value(row)


def _heads(model_pt: Path) -> set[str]:
    """Objective heads of a trained model, read from its saved parameters."""
    import torch

    saved = torch.load(model_pt, map_location="cpu", weights_only=False)
    tensors = next(v for v in saved.values() if isinstance(v, dict) and any(str(k).startswith("heads.") for k in v))
    return {k.split(".")[1] for k in tensors if k.startswith("heads.")}


def _run(dag, conf: dict | None = None):
    dr = dag.test(run_conf=conf or {})
    assert str(dr.state) == "success", f"{dag.dag_id} run {dr.state}: {_states(dr)}"
    return dr


# every check of the gate still runs (artifact, export, per-cell metrics), none can refuse a tiny model
OPEN_GATE = {"max_ne_regression": 1.0, "calibration": [0.01, 100.0], "teacher_epsilon": 10.0, "max_latency_ms": 10000.0,
             "max_artifact_mb": 10000.0, "floors": {"max_ne": 100.0, "min_auc": 0.0}}


def _tiny(tmp: Path, **kw) -> Path:
    folder = tmp / "configs"
    write_tiny_config(ROOT / "configs" / "demo.yaml", folder, data_root=tmp / "raw", workdir=tmp / "work", name="tiny", **kw)
    return folder


def test_a_missing_stage_fails_its_task_and_stops_the_run(airflow_db, monkeypatch, tmp_path: Path) -> None:
    from lattice import stages

    monkeypatch.delitem(stages.STAGES, "consolidate", raising=False)
    dag = _dags(monkeypatch, _tiny(tmp_path))["tiny__features"]
    dr = dag.test(run_conf={"synthetic_rows": 3000})
    assert str(dr.state) == "failed"
    states = _states(dr)
    # consolidate .. materialize are one task (one Spark session): it fails at its first step
    assert states == {"synthesize_raw_logs": "success", SPARK_TASK: "failed"}
    assert (tmp_path / "raw" / "manifest.json").exists()


def test_spark_steps_run_as_one_task_each_step_result_an_xcom(airflow_db, monkeypatch, tmp_path: Path) -> None:
    """The features DAG's Spark steps are one Airflow task: they run in order in it, each step's
    result is an XCom under the step's name, the task's own result is the last step's, and the
    features asset is announced once, when the task ends. (Stand-in stages: the real ones run in
    the whole-chain test below.)"""
    from lattice import stages

    real = stages.get_stage
    ran: list[str] = []

    def stand_in(name: str):
        if name == "synth":
            return real(name)

        def stage(config, paths, **kw):
            ran.append(name)
            return {"stage": name, "rows_out": 10 * len(ran)}
        return stage

    monkeypatch.setattr(stages, "get_stage", stand_in)
    dag = _dags(monkeypatch, _tiny(tmp_path))["tiny__features"]
    assert [t.task_id for t in dag.topological_sort()] == ["synthesize_raw_logs", SPARK_TASK]
    assert {o.name for o in dag.get_task(SPARK_TASK).outlets} == {"lattice.tiny.features"}
    dr = _run(dag, {"synthetic_rows": 3000})
    assert ran == ["consolidate", "aggregates", "feast_apply", "training_set", "materialize"]
    for i, step in enumerate(ran, 1):
        assert _xcom(dr, SPARK_TASK, key=step)["summary"] == {"stage": step, "rows_out": 10 * i}
    assert _xcom(dr, SPARK_TASK)["stage"] == "materialize"


def test_whole_chain_with_an_added_domain_and_objective(airflow_db, monkeypatch, tmp_path: Path, artifacts: Path) -> None:
    """features -> train_teacher -> distill -> promote on a copy of the demo config with one more
    domain and one more objective, added by config only: the DAGs offer them, and the models
    trained by the DAG runs have the new (domain, objective) cells."""
    missing = _missing(CHAIN)
    assert not missing, f"stages the DAG chain runs are not registered in lattice/stages.py: {missing}"
    # Feast's file (dask) offline store here: the demo config uses the Spark one, so both stay tested
    # a first model on a few thousand rows cannot be held to the demo's floors: the gate here is
    # wide open, so this chain must promote (the rejection path is the next test's, on a fixed decision)
    dags = _dags(monkeypatch, _tiny(tmp_path, new_domain_and_objective=True,
                                    overrides={"feature_store": {"offline_store": "file", "online_store": "sqlite"},
                                               "promotion": OPEN_GATE}))
    assert "search_mirror" in dags["tiny__features"].params.get_param("domains").schema["items"]["enum"]
    assert "deep_click" in dags["tiny__train_teacher"].params.get_param("objectives").schema["items"]["enum"]

    features = _run(dags["tiny__features"], {"synthetic_rows": ROWS})
    consolidated = _xcom(features, SPARK_TASK, key="consolidate")["summary"]
    assert consolidated["totals"]["rows_out"] > 0
    assert "search_mirror" in consolidated["domains"]
    assert _xcom(features, SPARK_TASK, key="training_set")["summary"]["rows"] > 0

    teacher = _run(dags["tiny__train_teacher"], {"epochs": 1, "nproc": 1})
    report = json.loads(Path(_xcom(teacher, "evaluate_teacher")["summary"]["report"]).read_text())
    assert {"feed/deep_click", "search_mirror/click", "search_mirror/conversion"} <= set(report["cells"])
    assert _xcom(teacher, "register_teacher")["summary"]["model"] == "teacher"
    assert "deep_click" in _heads(tmp_path / "work" / "models" / "teacher" / "model.pt")

    distill = _run(dags["tiny__distill"], {"epochs": 1, "nproc": 1})
    assert _heads(tmp_path / "work" / "models" / "student" / "model.pt") == {"click", "conversion", "deep_click"}
    student = _xcom(distill, "register_student")["summary"]
    assert student["model"] == "student" and student["challenger"] is True

    promote = dags["tiny__promote"].test(run_conf={"dry_run": False})
    assert _states(promote) == {"gate": "success", "promote_challenger": "success", "refresh_report": "success"}
    decision = _xcom(promote, "promote_challenger")["summary"]
    assert decision["passed"] and decision["champion_before"] is None
    assert decision["champion_after"] == student["version"]
    # the tasks' extra links (Airflow 3 keeps each as an XCom the UI reads): the report the chain
    # rewrote, the per-cell metrics of the registered student; names as the DAG declares them
    report = tmp_path / "work" / "report.html"
    assert _xcom(promote, "refresh_report", key="_link_lattice_report") == report.resolve().as_uri()
    metrics = tmp_path / "work" / "models" / "student" / "metrics.json"
    assert _xcom(distill, "register_student", key="_link_lattice_per_cell_test_metrics") == metrics.resolve().as_uri()
    assert {link.name for link in dags["tiny__promote"].get_task("gate").operator_extra_links} == {
        "MLflow gate decision", "MLflow next-day series", "report"}
    (artifacts / "dag_chain_promote.json").write_text(json.dumps(decision, indent=2, default=str))


def _try_numbers(dr) -> dict[str, int]:
    return {ti.task_id: ti.try_number for ti in dr.get_task_instances()}


REJECTED = {"passed": False, "decision": "reject", "challenger_version": 2, "champion_before": 1,
            "champion_after": 1, "dry_run": False, "gate_run_id": "run-1",
            "reasons": [{"passed": True, "message": "artifact parity 1e-7 <= 1e-4"},
                        {"passed": False, "message": "feed/click NE 0.912 regresses the champion's 0.880 by more than 0.01"}]}


def _fake_stages(monkeypatch, fakes: dict) -> None:
    from lattice import stages

    real = stages.get_stage
    monkeypatch.setattr(stages, "get_stage", lambda n: fakes.get(n) or real(n))


def test_a_rejected_promotion_is_a_decision_not_a_failure(airflow_db, monkeypatch, tmp_path: Path) -> None:
    """A rejection is its own state: the gate task succeeds (it decided; the decision and every
    reason are its XCom), the task that would move the champion is skipped, and so is the report
    refresh after it (the champion stays). A pass is green throughout."""
    dags = _dags(monkeypatch, _tiny(tmp_path), retries=2)
    promote = dags["tiny__promote"]
    assert [t.task_id for t in promote.tasks] == ["gate", "promote_challenger", "refresh_report"]
    moved = []
    # the real apply_gate reads the gate's recorded decision: a reject comes back as is, nothing moves
    _fake_stages(monkeypatch, {"gate": lambda config, paths, dry_run=False: dict(REJECTED),
                               "apply_gate": lambda config, paths, dry_run=False: dict(REJECTED),
                               "report": lambda config, paths, **_: moved.append("report") or {}})
    dr = promote.test(run_conf={"dry_run": False})
    assert _states(dr) == {"gate": "success", "promote_challenger": "skipped", "refresh_report": "skipped"}
    assert str(dr.state) == "success" and moved == []
    assert _try_numbers(dr)["gate"] == 1
    decision = _xcom(dr, "gate")["summary"]
    assert decision["reasons"] == REJECTED["reasons"] and decision["champion_after"] == 1
    assert _xcom(dr, "gate", key="decision")["summary"]["passed"] is False
    # a pass: the gate decides, promote_challenger moves the alias, the report is refreshed
    passed = {**REJECTED, "passed": True, "decision": "promote"}
    _fake_stages(monkeypatch, {"gate": lambda config, paths, dry_run=False: dict(passed),
                               "apply_gate": lambda config, paths, dry_run=False: {**passed, "champion_after": 2},
                               "report": lambda config, paths, **_: {"report": "refreshed"}})
    dr = promote.test(run_conf={"dry_run": False})
    assert _states(dr) == {"gate": "success", "promote_challenger": "success", "refresh_report": "success"}
    assert _xcom(dr, "promote_challenger")["summary"]["champion_after"] == 2


@pytest.mark.parametrize("crashing", ["gate", "apply_gate"])
def test_a_crash_in_the_promote_chain_fails_its_task(airflow_db, monkeypatch, tmp_path: Path, crashing: str) -> None:
    """A crash is red, never confused with a rejection: the task that crashed fails and the tasks
    after it are upstream_failed."""
    dags = _dags(monkeypatch, _tiny(tmp_path))  # no retries: the crash fails at once

    def crash(config, paths, dry_run=False):
        raise RuntimeError("registry unreachable")

    fakes = {"gate": lambda config, paths, dry_run=False: {**REJECTED, "passed": True},
             "apply_gate": lambda config, paths, dry_run=False: {**REJECTED, "passed": True, "champion_after": 2},
             "report": lambda config, paths, **_: {}}
    _fake_stages(monkeypatch, {**fakes, crashing: crash})
    dr = dags["tiny__promote"].test(run_conf={"dry_run": False})
    assert str(dr.state) == "failed"
    want = ({"gate": "failed", "promote_challenger": "upstream_failed", "refresh_report": "upstream_failed"}
            if crashing == "gate" else
            {"gate": "success", "promote_challenger": "failed", "refresh_report": "upstream_failed"})
    assert _states(dr) == want


def test_a_deterministic_error_fails_without_retries(airflow_db, monkeypatch, tmp_path: Path) -> None:
    """Params the form accepts but the run cannot (end not after start) fail the first task at
    once: a retry with back-off would only repeat the error."""
    dags = _dags(monkeypatch, _tiny(tmp_path), retries=2)
    dr = dags["tiny__features"].test(run_conf={"synthetic_rows": 3000, "start": "2026-01-05", "end": "2026-01-05"})
    assert str(dr.state) == "failed"
    assert _states(dr)["synthesize_raw_logs"] == "failed"
    assert _try_numbers(dr)["synthesize_raw_logs"] == 1
    assert _states(dr)[SPARK_TASK] == "upstream_failed"


def test_a_domain_subset_run_trains_on_that_subset(airflow_db, monkeypatch, tmp_path: Path) -> None:
    """The trigger form offers any subset of the domains: the run trains on those domains' rows
    (the table holds every domain's) and leaves one whole model folder."""
    from lattice.config import load_config
    from lattice.data.local_consolidate import consolidate, write_parquet
    from lattice.orchestration.locations import paths_for
    from lattice.orchestration.spec import dag_specs, defaults
    from lattice.orchestration.task_runner import run_task

    missing = _missing(["synth", "train", "evaluate", "register"])
    assert not missing, f"stages this run needs are not registered in lattice/stages.py: {missing}"
    folder = _tiny(tmp_path)
    cfg = folder / "tiny.yaml"
    config = load_config(cfg)
    features = next(s for s in dag_specs(config) if s.family == "features")
    run_task(cfg, features.tasks[0], {**defaults(features), "synthetic_rows": ROWS}, features.params)
    paths = paths_for(config)
    table = consolidate(config, paths)  # the local twin of the Spark pipeline: every domain's rows
    assert set(table["domain"]) == {"feed", "search", "video"}
    write_parquet(table, paths.consolidated / "part-0.parquet")
    teacher = _run(_dags(monkeypatch, folder)["tiny__train_teacher"],
                   {"domains": ["feed", "video"], "objectives": ["click"], "epochs": 1, "nproc": 1})
    report = json.loads(Path(_xcom(teacher, "evaluate_teacher")["summary"]["report"]).read_text())
    assert set(report["cells"]) == {"feed/click", "video/click"}
    # a subset is its own model variant: it never replaces (here: never creates) the full teacher
    from lattice.orchestration.run_paths import subset_variant, variant_name

    variant = subset_variant(["feed", "search", "video"], ["click", "conversion"], ["feed", "video"], ["click"])
    model = tmp_path / "work" / "models" / variant_name("teacher", variant)
    assert model.name != "teacher" and _heads(model / "model.pt") == {"click"}
    assert _xcom(teacher, "train_teacher")["summary"]["model_dir"] == str(model)
    assert not (tmp_path / "work" / "models" / "teacher").exists()
    assert not (tmp_path / "work" / ".staging").exists()
