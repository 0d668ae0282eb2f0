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
from tiny_dags import write_tiny_config

ROOT = Path(__file__).resolve().parents[2]


def _schema_ok(spec, name, value) -> bool:
    p = next(p for p in spec.params if p.name == name)
    try:
        jsonschema.validate(value, p.schema, format_checker=jsonschema.FormatChecker())
        return True
    except jsonschema.ValidationError:
        return False


@pytest.mark.parametrize("path", config_files(ROOT / "configs"), ids=lambda p: p.stem)
def test_every_shipped_config_gets_its_dags_with_valid_defaults(path: Path) -> None:
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


def test_a_run_the_retrain_asset_started_holds_out_the_configs_retrain_share() -> None:
    """monitoring.retrain_validation_share reaches the teacher's train stage only in a run a
    monitoring rule started (the retrain asset among its triggers), and never over the form."""
    from lattice.config.loader import ConfigError, parse_config
    from lattice.orchestration.spec import rule_started

    data = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    data["training"]["window"] = "7d"
    data["monitoring"] = {"rules": [{"kind": "calibration", "low": 0.9, "high": 1.1}], "retrain_validation_share": 0.5}
    cfg = parse_config(data)
    specs = {s.family: s for s in dag_specs(cfg)}
    teacher = specs["train_teacher"]
    train = next(t for t in teacher.tasks if t.stage == "train")
    form = defaults(teacher)
    assert form["validation_share"] is None and _schema_ok(teacher, "validation_share", 0.5)
    assert not _schema_ok(teacher, "validation_share", 0) and not _schema_ok(teacher, "validation_share", 1.5)
    retrain, features = f"lattice.{cfg.name}.retrain", f"lattice.{cfg.name}.features"

    def stage(config, paths, model, validation_share=None, **rest):
        return {}

    started = rule_started(cfg, "train_teacher", form, [features, retrain])
    assert stage_kwargs(stage, train, started, teacher.params)["validation_share"] == 0.5
    # new features alone, another family, or a share set on the form: the config's window_validation / the form
    assert "validation_share" not in stage_kwargs(stage, train, rule_started(cfg, "train_teacher", form, [features]),
                                                  teacher.params)
    assert rule_started(cfg, "distill", form, [retrain]) == form
    assert rule_started(cfg, "train_teacher", {**form, "validation_share": 0.8}, [retrain])["validation_share"] == 0.8
    data["training"]["window"] = None
    with pytest.raises(ConfigError, match="monitoring.retrain_validation_share"):
        parse_config(data)


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
    from lattice.orchestration.task_runner import DeterministicError

    monkeypatch.delitem(stages.STAGES, "gate", raising=False)
    spec = next(s for s in dag_specs(load_config(ROOT / "configs" / "demo.yaml")) if s.family == "promote")
    monkeypatch.setenv("LATTICE_WORKDIR", str(tmp_path))
    with pytest.raises(TaskError, match="'gate' is not registered in lattice/stages.py") as err:
        run_task(ROOT / "configs" / "demo.yaml", spec.tasks[0], defaults(spec), spec.params)
    # retrying cannot register a stage: the task must fail at once, not burn its retries
    assert isinstance(err.value, DeterministicError)


@pytest.mark.parametrize("path", config_files(ROOT / "configs"), ids=lambda p: p.stem)
def test_every_stage_a_dag_runs_is_registered(path: Path) -> None:
    """A stage dropped from the registry fails here, in the fast tier, before any DAG run would."""
    from lattice import stages

    named = {t.stage for spec in dag_specs(load_config(path)) for t in spec.tasks}
    named |= {t.switch[1] for spec in dag_specs(load_config(path)) for t in spec.tasks if t.switch}
    assert named and not named - set(stages.STAGES), sorted(named - set(stages.STAGES))


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


# ---------------------------------------------------------------- settings, retries, gate, subsets


def test_scheduled_runs_take_the_synthetic_row_count_from_the_config(tmp_path: Path) -> None:
    """A scheduled run uses the params' defaults: the row count must be the config's, not a
    number that lived only in the trigger form (which regenerated 200,000 rows every time)."""
    cfg_file = write_tiny_config(ROOT / "configs" / "demo.yaml", tmp_path, data_root=tmp_path / "raw",
                                 workdir=tmp_path / "work", overrides={})
    data = yaml.safe_load(cfg_file.read_text())
    data["synthetic"]["rows"] = 1500
    cfg_file.write_text(yaml.safe_dump(data, sort_keys=False))
    spec = next(s for s in dag_specs(load_config(cfg_file)) if s.family == "features")
    assert defaults(spec)["synthetic_rows"] == 1500
    out = run_task(cfg_file, spec.tasks[0], defaults(spec), spec.params)  # what a scheduled run passes
    assert out["summary"]["rows"] == 1500
    # every other param of every DAG defaults to the config too
    config = load_config(cfg_file)
    specs = {s.family: defaults(s) for s in dag_specs(config)}
    assert specs["features"]["start"] == config.time_range.start.isoformat()
    assert specs["train_teacher"]["epochs"] == config.training.epochs
    assert specs["distill"]["nproc"] == config.training.nproc


def _with_stage(monkeypatch, name: str, fn) -> None:
    from lattice import stages

    real = stages.get_stage
    monkeypatch.setitem(stages.STAGES, name, "test:fake")
    monkeypatch.setattr(stages, "get_stage", lambda n: fn if n == name else real(n))


def test_deterministic_errors_are_told_apart_from_retryable_ones(tmp_path: Path, monkeypatch) -> None:
    from lattice.config import ConfigError, Problem
    from lattice.orchestration.task_runner import DeterministicError
    from pipelines.sources import SourceError
    from pipelines.validate import ValidationFailed

    monkeypatch.setenv("LATTICE_WORKDIR", str(tmp_path / "work"))
    spec = next(s for s in dag_specs(load_config(ROOT / "configs" / "demo.yaml")) if s.family == "promote")
    task = spec.tasks[0]
    raised: list[BaseException] = []

    def failing(config, paths, dry_run=False):
        raise raised[-1]

    _with_stage(monkeypatch, "gate", failing)
    for exc in (SourceError("feed_log: no column 'ts'"), ValidationFailed([], None),
                ConfigError("x.yaml", [Problem("a", 1, "bad")]), RuntimeError("wrapped")):
        if isinstance(exc, RuntimeError) and not isinstance(exc, ValidationFailed):
            exc.__cause__ = SourceError("the real cause")  # a deterministic cause counts too
        raised.append(exc)
        with pytest.raises(DeterministicError, match="not retried"):
            run_task(ROOT / "configs" / "demo.yaml", task, defaults(spec), spec.params)
    raised.append(OSError("the registry is busy"))
    with pytest.raises(TaskError, match="registry is busy") as info:
        run_task(ROOT / "configs" / "demo.yaml", task, defaults(spec), spec.params)
    assert not isinstance(info.value, DeterministicError)  # retried with back-off
    # an invalid config file and a bad param are deterministic before any stage runs
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nnot_a_key: 1\n")
    with pytest.raises(DeterministicError, match="not_a_key"):
        run_task(bad, task, defaults(spec), spec.params)
    with pytest.raises(DeterministicError, match="unknown params"):
        run_task(ROOT / "configs" / "demo.yaml", task, {"epochs": 2}, spec.params)


def test_a_rejected_promotion_is_a_gate_rejection_with_every_reason(tmp_path: Path, monkeypatch) -> None:
    from lattice.orchestration.task_runner import GateRejected

    monkeypatch.setenv("LATTICE_WORKDIR", str(tmp_path / "work"))
    spec = next(s for s in dag_specs(load_config(ROOT / "configs" / "demo.yaml")) if s.family == "promote")
    task, act = spec.tasks[0], spec.tasks[1]
    assert (task.task_id, task.gate, task.acts_on_gate) == ("gate", "passed", False)
    assert (act.task_id, act.gate, act.acts_on_gate) == ("promote_challenger", "passed", True)
    decision = {"passed": False, "decision": "reject", "challenger_version": 4, "champion_before": 3,
                "champion_after": 3, "dry_run": False, "gate_run_id": "r1",
                "reasons": [{"passed": True, "message": "export parity ok"},
                            {"passed": False, "message": "feed/click NE 0.91 > champion 0.88"},
                            {"passed": False, "message": "p99 latency 12 ms > 10 ms"}]}
    _with_stage(monkeypatch, "gate", lambda config, paths, dry_run=False: dict(decision))
    with pytest.raises(GateRejected) as info:
        run_task(ROOT / "configs" / "demo.yaml", task, defaults(spec), spec.params)
    message = str(info.value)
    assert "REJECTED challenger v4" in message and "champion stays v3" in message
    assert "feed/click NE 0.91 > champion 0.88" in message and "p99 latency 12 ms > 10 ms" in message
    assert "export parity ok" not in message  # only the failed checks
    assert info.value.result["summary"]["reasons"] == decision["reasons"]
    # a pass is a success, and a rollback is never gated
    _with_stage(monkeypatch, "gate", lambda config, paths, dry_run=False: {**decision, "passed": True})
    assert run_task(ROOT / "configs" / "demo.yaml", task, defaults(spec), spec.params)["summary"]["passed"] is True
    # the gate lets a rollback through without judging, and the step after it rolls back
    from lattice.promotion.stages import gate

    assert gate(None, None, rollback=True)["passed"] is True
    _with_stage(monkeypatch, "rollback", lambda config, paths: {"from_version": 3, "to_version": 2})
    out = run_task(ROOT / "configs" / "demo.yaml", act, {**defaults(spec), "rollback": True}, spec.params)
    assert out["stage"] == "rollback"


def _table(folder: Path, hive: bool) -> None:
    import pandas as pd

    from lattice.data.local_consolidate import write_parquet

    df = pd.DataFrame({"example_id": [f"e{i}" for i in range(9)], "domain": ["feed", "search", "video"] * 3,
                       "x": range(9)})
    if hive:
        for d, part in df.groupby("domain"):
            write_parquet(part.drop(columns="domain"), folder / f"domain={d}" / "part-0.parquet")
    else:
        write_parquet(df, folder / "part-0.parquet")


@pytest.mark.parametrize("hive", [False, True], ids=["flat", "hive"])
def test_a_domain_subset_reads_only_its_domains_rows(tmp_path: Path, hive: bool) -> None:
    import pyarrow.dataset as ds

    from lattice.orchestration.narrow import SubsetError
    from lattice.orchestration.run_paths import subset_table
    from lattice.paths import Paths

    home = Paths(workdir=tmp_path / "work", data_root=tmp_path / "raw")
    _table(home.training_set if not hive else home.consolidated, hive)
    sub = subset_table(home, ["video", "feed"])
    got = ds.dataset(str(sub), format="parquet", partitioning="hive").to_table().to_pandas()
    assert sorted(got["domain"].astype(str)) == ["feed"] * 3 + ["video"] * 3
    assert sorted(got["x"]) == [0, 2, 3, 5, 6, 8]
    assert subset_table(home, ["feed", "video"]) == sub  # reused while the table is unchanged
    _table(home.training_set if not hive else home.consolidated, hive)  # the table is rewritten ...
    again = subset_table(home, ["feed", "video"])
    assert again != sub and not sub.exists()  # ... so the subset is rebuilt and the stale one removed
    with pytest.raises(SubsetError, match="no rows of the domains"):
        subset_table(home, ["shorts"])


def test_a_failed_training_keeps_the_previous_model_whole(tmp_path: Path, monkeypatch) -> None:
    """The model folder is written in a scratch folder and replaces the old one only on success."""
    monkeypatch.setenv("LATTICE_WORKDIR", str(tmp_path / "work"))
    spec = next(s for s in dag_specs(load_config(ROOT / "configs" / "demo.yaml")) if s.family == "train_teacher")
    train = next(t for t in spec.tasks if t.task_id == "train_teacher")
    assert train.replaces_model == "teacher"
    old = tmp_path / "work" / "models" / "teacher"
    old.mkdir(parents=True)
    (old / "model.pt").write_text("old weights")
    (old / "metrics.json").write_text("old metrics")
    (old / "stale.json").write_text("only the old run wrote this")

    def crashing(config, paths, model, epochs=None, nproc=None):
        out = paths.model_dir(model)
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").write_text("new metrics")
        raise RuntimeError("rank 1 died")

    _with_stage(monkeypatch, "train", crashing)
    with pytest.raises(TaskError, match="rank 1 died"):
        run_task(ROOT / "configs" / "demo.yaml", train, defaults(spec), spec.params)
    assert {p.name: p.read_text() for p in old.iterdir()} == {
        "model.pt": "old weights", "metrics.json": "old metrics", "stale.json": "only the old run wrote this"}
    assert not (tmp_path / "work" / ".staging").exists()

    def training(config, paths, model, epochs=None, nproc=None):
        out = paths.model_dir(model)
        assert out != old  # never written in place
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.pt").write_text("new weights")
        (out / "metrics.json").write_text("new metrics")
        return {"model_dir": str(out), "report": str(paths.reports / "x.json")}

    _with_stage(monkeypatch, "train", training)
    out = run_task(ROOT / "configs" / "demo.yaml", train, defaults(spec), spec.params)
    assert {p.name: p.read_text() for p in old.iterdir()} == {"model.pt": "new weights", "metrics.json": "new metrics"}
    assert out["summary"]["model_dir"] == str(old)  # the summary names where the model ended up
    assert out["summary"]["report"] == str(tmp_path / "work" / "reports" / "x.json")
    assert not (tmp_path / "work" / ".staging").exists()


@pytest.mark.parametrize("form, value", [("true", True), ("false", False), (None, None), (True, True), (False, False)])
def test_the_fp8_choice_of_the_training_forms_sets_fp8_enabled_for_the_run(tmp_path: Path, monkeypatch, form, value) -> None:
    from lattice import stages
    from lattice.orchestration.spec import form_values

    seen = {}

    def fake_train(config, paths, **kw):
        seen["fp8"] = config.fp8.enabled
        model = paths.model_dir(kw.get("model", "student"))
        model.mkdir(parents=True, exist_ok=True)
        (model / "model.pt").write_bytes(b"stand-in")  # what the staging commit checks for
        return {"ok": True}

    config = load_config(ROOT / "configs" / "demo.yaml")
    for family, task_id in (("train_teacher", "train_teacher"), ("distill", "distill_student")):
        spec = next(s for s in dag_specs(config) if s.family == family)
        task = next(t for t in spec.tasks if t.task_id == task_id)
        # the form's values validate; a boolean passed to run_task itself (no form) is kept as it is
        assert "fp8" in {p.name for p in spec.params} and _schema_ok(spec, "fp8", form) is not isinstance(form, bool)
        params = form_values({**defaults(spec), "fp8": form}, spec.params)
        assert params["fp8"] is value
        monkeypatch.setattr(stages, "get_stage", lambda name: fake_train)
        monkeypatch.setenv("LATTICE_WORKDIR", str(tmp_path))
        seen.clear()
        run_task(ROOT / "configs" / "demo.yaml", task, params, spec.params)
        assert seen["fp8"] is (config.fp8.enabled if value is None else value)


@pytest.mark.parametrize("enabled", [True, False])
def test_the_fp8_param_is_a_three_way_choice_that_names_the_config_value(enabled) -> None:
    from airflow.sdk import Param
    from airflow.sdk.exceptions import ParamValidationError

    base = load_config(ROOT / "configs" / "demo.yaml")
    config = base.model_copy(update={"fp8": base.fp8.model_copy(update={"enabled": enabled})})
    for spec in dag_specs(config):
        for p in spec.params:
            # no parameter is a nullable boolean: Airflow's form draws those as a two-state switch
            types = p.schema.get("type") if isinstance(p.schema.get("type"), list) else [p.schema.get("type")]
            assert not ("boolean" in types and "null" in types), (spec.dag_id, p.name)
    spec = next(s for s in dag_specs(config) if s.family == "train_teacher")
    fp8 = next(p for p in spec.params if p.name == "fp8")
    assert fp8.schema["enum"] == [None, "true", "false"] and fp8.default is None
    # Airflow 3.3's form picks its widget from the first non-null type: "string" with an enum is a
    # drop-down (a "boolean" would be a switch), each choice labelled by values_display
    assert [t for t in fp8.schema["type"] if t != "null"][0] == "string"
    shown = "on" if enabled else "off"
    assert fp8.schema["values_display"] == {"null": f"config default ({shown})", "true": "on", "false": "off"}
    param = Param(fp8.default, description=fp8.description, title=fp8.title, **fp8.schema)
    assert param.schema["values_display"]["null"] == f"config default ({shown})"  # reaches the serialized form
    assert [param.resolve(v) for v in (None, "true", "false")] == [None, "true", "false"]
    with pytest.raises(ParamValidationError):
        param.resolve("yes")


def test_the_tune_dag_is_manual_and_forwards_its_params_to_the_tune_stage() -> None:
    from lattice.stages import get_stage

    config = load_config(ROOT / "configs" / "demo.yaml")
    spec = next(s for s in dag_specs(config) if s.family == "tune")
    assert spec.dag_id == "demo__tune" and spec.schedule.cron is None and spec.schedule.asset is None
    assert defaults(spec) == {"model": "teacher", "trials": config.tune.trials, "epochs": config.tune.epochs,
                              "nproc": config.training.nproc, "study": None}
    [task] = spec.tasks
    kwargs = stage_kwargs(get_stage(task.stage), task, {"trials": 3, "study": "night"}, spec.params)
    assert kwargs == {"model": "teacher", "trials": 3, "epochs": config.tune.epochs, "nproc": config.training.nproc,
                      "study": "night"}
    assert not _schema_ok(spec, "model", "student")


def test_a_cron_dags_form_names_the_dates_an_unpause_runs() -> None:
    """Airflow creates the latest complete interval's run on unpause; the form says which days,
    and that a day outside time_range processes nothing."""
    import datetime as dt

    import airflow  # noqa: F401  (the DAG file has it loaded when it reads the specs)

    from lattice.config import load_config
    from lattice.orchestration.spec import dag_specs, unpause_interval

    cfg = load_config(ROOT / "configs" / "demo.yaml")
    start, end = unpause_interval("@daily")
    today = dt.datetime.now(dt.timezone.utc).date()
    assert (start, end) == (today - dt.timedelta(days=1), today)
    form = {d.family: d for d in dag_specs(cfg)}["features"].params[0].description
    assert f"Today that is [{start}, {end}), outside the config's time_range [2026-01-01, 2026-01-15)" in form
    inside = cfg.model_copy(update={"time_range": cfg.time_range.model_copy(update={"end": today})})
    assert f"Today that is [{start}, {end})." in {d.family: d for d in dag_specs(inside)}["features"].params[0].description


def test_specs_read_outside_airflow_leave_the_process_logging_alone() -> None:
    """The CLI, the demo and a task's steps read the specs; Airflow is not imported for the form's
    note there (its import replaces the root logger's handlers, and a task's stage lines vanished)."""
    import subprocess
    import sys

    code = ("import sys; from lattice.config import load_config; from lattice.orchestration.spec import dag_specs; "
            f"dag_specs(load_config({str(ROOT / 'configs' / 'demo.yaml')!r})); print('airflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"
