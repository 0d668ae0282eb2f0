"""DAG specs and the task runner, without Airflow: what every config's DAGs run, their parameters,
and how run parameters reach (or are refused by) a stage."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from lattice.config import load_config
from lattice.orchestration.locations import config_files
from lattice.orchestration.spec import FAMILIES, dag_specs, defaults
from lattice.orchestration.task_runner import TaskError, check_params, run_task, stage_kwargs
from lattice.orchestration.tiny import write_tiny_config

ROOT = Path(__file__).resolve().parents[2]


def _schema_ok(spec, name, value) -> bool:
    p = next(p for p in spec.params if p.name == name)
    try:
        jsonschema.validate(value, p.schema, format_checker=jsonschema.FormatChecker())
        return True
    except jsonschema.ValidationError:
        return False


@pytest.mark.parametrize("path", config_files(ROOT / "configs"), ids=lambda p: p.stem)
def test_every_shipped_config_gets_four_dags_with_valid_defaults(path: Path) -> None:
    config = load_config(path)
    specs = dag_specs(config)
    assert [s.dag_id for s in specs] == [f"{config.name}__{f}" for f in FAMILIES]
    for spec in specs:
        assert spec.tasks, spec.dag_id
        for p in spec.params:
            assert p.description and p.title
            assert _schema_ok(spec, p.name, p.default), (spec.dag_id, p.name)
        # the schedule comes from the config, never from code
        assert spec.schedule == getattr(config.schedules, spec.family)


def test_params_enumerate_the_configs_domains_and_objectives(tmp_path: Path) -> None:
    cfg_file = write_tiny_config(ROOT / "configs" / "demo.yaml", tmp_path, data_root=tmp_path / "raw",
                                 workdir=tmp_path / "work", new_domain_and_objective=True)
    config = load_config(cfg_file)
    teacher = next(s for s in dag_specs(config) if s.family == "train_teacher")
    assert defaults(teacher)["domains"] == ["feed", "search", "video", "search_mirror"]
    assert defaults(teacher)["objectives"] == ["click", "conversion", "deep_click"]
    assert _schema_ok(teacher, "objectives", ["deep_click"])
    assert not _schema_ok(teacher, "objectives", ["nope"])
    assert not _schema_ok(teacher, "objectives", [])
    assert not _schema_ok(teacher, "epochs", 0)
    features = next(s for s in dag_specs(config) if s.family == "features")
    assert not _schema_ok(features, "start", "yesterday")
    # the synthetic step exists only for configs with a 'synthetic' section
    assert features.tasks[0].stage == "synth"
    criteo = next(s for s in dag_specs(load_config(ROOT / "configs" / "criteo.yaml")) if s.family == "features")
    assert "synth" not in [t.stage for t in criteo.tasks]


def test_schedules_follow_the_config(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    data["schedules"] = {"features": {"cron": "0 3 * * *"}, "train_teacher": {"cron": "@weekly"},
                         "distill": {"asset": "teacher"}, "promote": {}}
    (tmp_path / "demo.yaml").write_text(yaml.safe_dump(data))
    specs = {s.family: s.schedule for s in dag_specs(load_config(tmp_path / "demo.yaml"))}
    assert specs["features"].cron == "0 3 * * *" and specs["train_teacher"].cron == "@weekly"
    assert specs["distill"].asset == "teacher"
    assert specs["promote"].cron is None and specs["promote"].asset is None


def test_cross_field_and_unknown_params_are_refused() -> None:
    spec = next(s for s in dag_specs(load_config(ROOT / "configs" / "demo.yaml")) if s.family == "features")
    check_params({"start": "2026-01-01", "end": "2026-01-05"}, spec.params)
    with pytest.raises(TaskError, match="must be after start"):
        check_params({"start": "2026-01-05", "end": "2026-01-05"}, spec.params)
    with pytest.raises(TaskError, match=r"unknown params \['epochs'\]"):
        check_params({"epochs": 3}, spec.params)


def test_changed_params_reach_the_stage_or_fail_loudly() -> None:
    specs = {s.family: s for s in dag_specs(load_config(ROOT / "configs" / "demo.yaml"))}
    teacher, features = specs["train_teacher"], specs["features"]
    train = next(t for t in teacher.tasks if t.stage == "train")
    consolidate = next(t for t in features.tasks if t.stage == "consolidate")

    def with_epochs(config, paths, model, epochs=1, nproc=1):
        return {}

    def passes_on(config, paths, **params):
        return {}

    def no_domains(config, paths, start=None, end=None, master=None):
        return {}

    params = {**defaults(teacher), "epochs": 5}
    assert stage_kwargs(with_epochs, train, params, teacher.params) == {"epochs": 5, "nproc": 2, "model": "teacher"}
    # a **params stage gets only what the user changed (plus the DAG's fixed keywords)
    assert stage_kwargs(passes_on, train, params, teacher.params) == {"epochs": 5, "model": "teacher"}
    # a changed param the stage cannot apply is an error, never silently ignored ...
    with pytest.raises(TaskError, match="takes no 'domains' keyword"):
        stage_kwargs(no_domains, consolidate, {**defaults(features), "domains": ["feed"]}, features.params)
    # ... while one left at its default is simply not passed
    assert "domains" not in stage_kwargs(no_domains, consolidate, defaults(features), features.params)


def test_a_subset_of_domains_and_objectives_narrows_the_config() -> None:
    from lattice.orchestration.narrow import SubsetError, narrow_config

    config = load_config(ROOT / "configs" / "demo.yaml")
    assert narrow_config(config, config.domain_names, config.objective_names) is config
    small = narrow_config(config, ["feed", "video"], ["click"])
    assert small.domain_names == ["feed", "video"] and small.objective_names == ["click"]
    assert small.cells() == [("feed", "click"), ("video", "click")]
    assert [s.name for s in small.sources] == ["feed_log", "video_log"]
    assert all(set(s.labels) == {"click"} for s in small.sources)
    assert small.features == config.features  # model inputs do not change
    with pytest.raises(SubsetError, match="no label in the chosen domains"):
        narrow_config(config, ["video"], ["conversion"])
    with pytest.raises(SubsetError, match="not a subset"):
        narrow_config(config, ["tv"], None)


def test_unregistered_stage_fails_with_a_clear_message(tmp_path: Path, monkeypatch) -> None:
    from lattice import stages
    from lattice.orchestration.spec import TaskSpec

    monkeypatch.delitem(stages.STAGES, "promote", raising=False)
    spec = next(s for s in dag_specs(load_config(ROOT / "configs" / "demo.yaml")) if s.family == "promote")
    monkeypatch.setenv("LATTICE_WORKDIR", str(tmp_path))
    with pytest.raises(TaskError, match="'promote' is not registered in lattice/stages.py"):
        run_task(ROOT / "configs" / "demo.yaml", spec.tasks[0], defaults(spec), spec.params)
    assert isinstance(spec.tasks[0], TaskSpec)


def test_task_runs_a_registered_stage_in_the_project_paths(tmp_path: Path, monkeypatch) -> None:
    cfg_file = write_tiny_config(ROOT / "configs" / "demo.yaml", tmp_path, data_root=tmp_path / "raw", workdir=tmp_path / "work")
    spec = next(s for s in dag_specs(load_config(cfg_file)) if s.family == "features")
    synth = spec.tasks[0]
    out = run_task(cfg_file, synth, {**defaults(spec), "synthetic_rows": 3000}, spec.params)
    assert out["stage"] == "synth" and out["summary"]["rows"] == 3000
    assert (tmp_path / "raw" / "manifest.json").exists()
    # idempotent: the same run again finds its output and replaces nothing
    again = run_task(cfg_file, synth, {**defaults(spec), "synthetic_rows": 3000}, spec.params)
    assert again["summary"]["skipped"] is True


def test_stage_summaries_become_strict_json() -> None:
    from lattice.orchestration.task_runner import _jsonable

    out = _jsonable({"ne": float("nan"), "auc": 0.7, ("a", "b"): [float("inf"), Path("/x")], "n": 3})
    assert out == {"ne": None, "auc": 0.7, "('a', 'b')": [None, "/x"], "n": 3}
