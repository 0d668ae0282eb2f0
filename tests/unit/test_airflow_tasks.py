"""How the graph's steps become Airflow tasks: consecutive Spark steps share one task (one process,
one Spark session), every other step is a task of its own, and a grouped task runs its steps in
order with a start and an end line for each in its log."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from lattice.config import load_config
from lattice.orchestration.spec import SPARK_STAGES, TaskSpec, airflow_tasks, dag_specs
from lattice.orchestration.task_runner import TaskError, run_steps
from tiny_dags import write_tiny_config

ROOT = Path(__file__).resolve().parents[2]


def _specs(path: Path = ROOT / "configs" / "demo.yaml", leaves: bool = True):
    config = load_config(path, [] if leaves else ["models.leaves.models=[]"])
    return {s.family: s for s in dag_specs(config)}


def test_features_spark_steps_are_one_task_and_other_families_one_task_a_step() -> None:
    # the trees' fit (models.leaves, on by default) is the teacher DAG's first task, on its days
    with_trees = _specs()
    assert [t.task_id for t in with_trees["features"].airflow_tasks] == ["synthesize_raw_logs", "consolidate_to_materialize"]
    assert [t.task_id for t in with_trees["train_teacher"].airflow_tasks][:2] == ["fit_trees", "train_teacher"]
    specs = _specs(leaves=False)
    features = specs["features"].airflow_tasks
    assert [t.task_id for t in features] == ["synthesize_raw_logs", "consolidate_to_materialize"]
    group = features[1]
    assert [s.task_id for s in group.steps] == [s.task_id for s in specs["features"].tasks[1:]]
    assert {s.stage for s in group.steps} <= SPARK_STAGES
    assert group.last.outlet == "features"  # the asset is announced when the whole chain is done
    assert all(f"`{s.task_id}`" in group.doc for s in group.steps)
    for family in ("train_teacher", "distill", "promote", "monitor", "tune"):
        spec = specs[family]
        assert [t.task_id for t in spec.airflow_tasks] == [s.task_id for s in spec.tasks], family


def test_a_group_may_not_announce_an_asset_before_its_last_step() -> None:
    a = TaskSpec("a", "consolidate", "first", outlet="features")
    b = TaskSpec("b", "aggregates", "second")
    with pytest.raises(ValueError, match=r"\['a'\]"):
        airflow_tasks([a, b])
    # a non-Spark step between two Spark steps splits them
    mid = TaskSpec("m", "synth", "not spark")
    assert [t.task_id for t in airflow_tasks([replace(a, outlet=None), mid, b])] == ["a", "m", "b"]


def test_cron_dag_form_and_docs_say_what_an_unpause_starts() -> None:
    specs = _specs()
    first = specs["features"].params[0]
    assert "also starts one scheduled run now" in first.description and "`@daily`" in first.description
    assert "**No catch-up**" in specs["features"].doc_md and "airflow backfill create" in specs["features"].doc_md
    teacher = specs["train_teacher"]
    assert "Unpausing starts no run" in teacher.doc_md
    assert all("scheduled run now" not in p.description for p in teacher.params)


def test_run_steps_runs_in_order_logs_each_step_and_stops_at_a_failure(tmp_path, monkeypatch, caplog) -> None:
    from lattice import stages

    folder = tmp_path / "configs"
    write_tiny_config(ROOT / "configs" / "demo.yaml", folder, data_root=tmp_path / "raw", workdir=tmp_path / "work",
                      name="grp")
    cfg = next(folder.glob("*.yaml"))
    spec = _specs(cfg)["features"]
    group = spec.airflow_tasks[1].steps
    ran: list[str] = []

    def fake(name: str, fail: bool = False):
        def stage(config, paths, **kw):
            ran.append(name)
            if fail:
                raise RuntimeError(f"{name} broke")
            return {"rows": len(ran)}
        return stage

    broken = group[2].stage
    monkeypatch.setattr(stages, "get_stage", lambda n: fake(n, fail=n == broken))
    caplog.set_level(logging.INFO, logger="lattice.orchestration")
    with pytest.raises(TaskError, match=f"{broken} broke"):
        run_steps(cfg, group, {}, spec.params)
    assert ran == [s.stage for s in group[:3]]
    text = caplog.text
    assert f"==> step 1/{len(group)} {group[0].task_id}" in text and f"<== step 2/{len(group)} {group[1].task_id} done" in text
    assert f"step 3/{len(group)} {group[2].task_id} failed" in text and f"not run: {group[3].task_id}" in text

    ran.clear()
    monkeypatch.setattr(stages, "get_stage", lambda n: fake(n))
    results = run_steps(cfg, group, {}, spec.params)
    assert list(results) == [s.task_id for s in group] and ran == [s.stage for s in group]
    assert results[group[-1].task_id]["summary"] == {"rows": len(group)}
