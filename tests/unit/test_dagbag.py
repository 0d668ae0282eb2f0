"""The DAG folder as Airflow's DagBag sees it: no import errors, one family of DAGs per
config, parse time measured, and configs (not code) decide which DAGs exist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lattice.orchestration.airflow_env import apply_local_airflow_env, local_airflow_env, process_test_home
from lattice.orchestration.locations import config_files
from lattice.orchestration.spec import FAMILIES

ROOT = Path(__file__).resolve().parents[2]
DAGS = ROOT / "dags"
apply_local_airflow_env(process_test_home())  # before Airflow is imported anywhere in this process

HEAVY = ("torch", "torchrec", "pyspark", "feast", "great_expectations", "mlflow", "pandas")

PARSE_SCRIPT = """
import json, sys, time
t0 = time.perf_counter()
from airflow.dag_processing.dagbag import DagBag
t1 = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
again = DagBag(dag_folder=sys.argv[1])  # warm: libraries already imported, as in a long-running dag-processor
print(json.dumps({
    "import_airflow_s": t1 - t0,
    "files": {s.file: s.duration.total_seconds() for s in bag.dagbag_stats},
    "warm_files": {s.file: s.duration.total_seconds() for s in again.dagbag_stats},
    "dag_ids": sorted(bag.dag_ids), "import_errors": {k: str(v) for k, v in bag.import_errors.items()},
    "heavy": sorted(m for m in sys.modules if m.split(".")[0] in %r),
}))
""" % (HEAVY,)


def _bag(monkeypatch, configs: Path):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("LATTICE_CONFIGS_DIR", str(configs))
    monkeypatch.delenv("LATTICE_AIRFLOW_RETRIES", raising=False)  # the shipped default, whatever ran before
    return DagBag(dag_folder=str(DAGS))


def _assets(dag) -> set[str]:
    return {asset.name for asset in dag.timetable.asset_condition.objects}


def test_dag_folder_parses_cleanly_and_without_heavy_imports(artifacts: Path) -> None:
    env = {**os.environ, **local_airflow_env(process_test_home())}
    env.pop("LATTICE_CONFIGS_DIR", None)
    out = subprocess.run([sys.executable, "-c", PARSE_SCRIPT, str(DAGS)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    stats = json.loads(out.stdout.strip().splitlines()[-1])
    assert stats["import_errors"] == {}
    expected = {f"{yaml.safe_load(p.read_text())['name']}__{f}" for p in config_files(ROOT / "configs") for f in FAMILIES}
    assert set(stats["dag_ids"]) == expected
    # parse time is a figure to watch, not a timed assertion: it is printed and kept as an artifact
    (artifacts / "dag_parse_times.json").write_text(json.dumps(stats, indent=2))
    print(f"\nDAG parse time per file (s): cold {stats['files']}, warm {stats['warm_files']}")
    # what keeps parsing fast: defining the DAGs imports no ML or data library
    assert stats["heavy"] == [], f"DAG parsing imported heavy modules: {stats['heavy']}"


def test_dags_carry_ui_params_schedules_and_retries(monkeypatch) -> None:
    bag = _bag(monkeypatch, ROOT / "configs")
    features, teacher = bag.dags["demo__features"], bag.dags["demo__train_teacher"]
    distill, promote = bag.dags["demo__distill"], bag.dags["demo__promote"]
    form = features.params.dump()
    assert {"start", "end", "domains", "spark_master", "synthetic_rows"} <= set(form)
    assert features.params.get_param("domains").schema["items"]["enum"] == ["feed", "search", "video"]
    assert all(features.params.get_param(k).description for k in form)
    assert {"epochs", "nproc", "domains", "objectives"} <= set(teacher.params.dump())
    assert set(promote.params.dump()) == {"dry_run", "rollback"}
    # configs/demo.yaml: daily features, then each DAG triggered by the asset of the one before
    # a daily run works on the day that just ended (its data interval), not on the instant it starts
    from airflow.sdk.definitions.timetables.interval import CronDataIntervalTimetable

    assert isinstance(features.timetable, CronDataIntervalTimetable) and features.timetable.expression == "0 0 * * *"
    assert {o.name for t in features.tasks for o in t.outlets} == {"lattice.demo.features"}
    assert _assets(teacher) == {"lattice.demo.features"}
    assert _assets(distill) == {"lattice.demo.teacher"}
    assert _assets(promote) == {"lattice.demo.student"}
    for dag in (features, teacher, distill, promote):
        for task in dag.tasks:
            assert task.retries >= 1 and task.retry_exponential_backoff, task.task_id
    assert [t.task_id for t in teacher.topological_sort()] == [
        "fit_trees", "train_teacher", "evaluate_teacher", "register_teacher", "train_separate", "train_pooled", "train_mmoe",
        "train_gbdt", "train_gbdt_cell", "evaluate_vs_trees"]


def test_a_new_config_or_domain_changes_the_dags_without_code(monkeypatch, tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    (tmp_path / "demo.yaml").write_text(yaml.safe_dump(data))
    data = {**data, "name": "shop", "domains": [*data["domains"], {"name": "shorts", "min_rows": 1}]}
    data["sources"] = [*data["sources"], {**data["sources"][2], "name": "shorts_log", "domain": "shorts"}]
    click = data["objectives"][0]
    data["objectives"] = [{**click, "domains": [*click["domains"], "shorts"]}, *data["objectives"][1:]]
    (tmp_path / "shop.yaml").write_text(yaml.safe_dump(data))
    bag = _bag(monkeypatch, tmp_path)
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == {f"{c}__{f}" for c in ("demo", "shop") for f in FAMILIES}
    assert "shorts" in bag.dags["shop__features"].params.get_param("domains").schema["items"]["enum"]
    assert "shorts" not in bag.dags["demo__features"].params.get_param("domains").schema["items"]["enum"]


def test_an_invalid_config_is_an_import_error_naming_its_file_every_problem_and_the_fix(monkeypatch, tmp_path: Path) -> None:
    """Airflow's import-error banner shows each invalid config, while the valid configs' DAGs stay:
    the error belongs to a file that holds no DAG, since Airflow hides every DAG of a file with an
    import error."""
    demo = (ROOT / "configs" / "demo.yaml").read_text()
    (tmp_path / "demo.yaml").write_text(demo)
    (tmp_path / "broken.yaml").write_text("name: broken\nnot_a_key: 1\n")
    data = yaml.safe_load(demo)
    data["name"] = "typo"
    data["training"]["epoch"] = data["training"].pop("epochs")  # the typo of the issue
    data.setdefault("promotion", {})["export_tolerance"] = -1  # and a second problem in the same file
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "twin.yaml").write_text(demo)  # a second config named 'demo'
    bag = _bag(monkeypatch, tmp_path)
    # the valid config's DAGs, and in the list one placeholder per invalid file carrying its problems
    placeholders = {"broken__invalid_config", "typo__invalid_config", "twin__invalid_config"}
    assert set(bag.dag_ids) == {f"demo__{f}" for f in FAMILIES} | placeholders
    typo = bag.dags["typo__invalid_config"]
    assert "INVALID CONFIG" in typo.description and "invalid-config" in typo.tags
    assert "unknown key 'epoch'; did you mean 'epochs'?" in typo.doc_md
    assert [t.task_id for t in typo.tasks] == ["fix_the_config"]
    [(file, message)] = bag.import_errors.items()
    assert Path(file).name == "lattice_config_errors.py"
    assert all(Path(d.fileloc).name == "lattice_dags.py" for d in bag.dags.values())  # never the erroring file
    assert "3 Lattice platform configs are invalid" in message
    for name in ("broken.yaml", "typo.yaml", "twin.yaml"):
        assert str(tmp_path / name) in message  # the user's file, not configs/demo.yaml
        assert f"Fix: edit {tmp_path / name}" in message
    assert "unknown key 'not_a_key'" in message and "time_range" in message  # every problem, not the first
    assert "unknown key 'epoch'; did you mean 'epochs'?" in message and "export_tolerance" in message
    assert ", ".join(f"typo__{f}" for f in FAMILIES) + " are not loaded" in message
    assert f"{tmp_path / 'demo.yaml'} already uses this name" in message
    assert "lattice config check" in message
    # fixed: the error clears and the DAGs are back under the same ids (their history with them)
    data["training"]["epochs"] = data["training"].pop("epoch")
    data["promotion"]["export_tolerance"] = 0.001
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    for name in ("broken.yaml", "twin.yaml"):
        (tmp_path / name).unlink()
    bag = _bag(monkeypatch, tmp_path)
    assert bag.import_errors == {}
    assert {f"typo__{f}" for f in FAMILIES} <= set(bag.dag_ids)
    assert not [d for d in bag.dag_ids if d.endswith("__invalid_config")]


def test_the_synthetic_row_count_default_is_the_configs(monkeypatch, tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    data["synthetic"]["rows"] = 4321
    (tmp_path / "demo.yaml").write_text(yaml.safe_dump(data))
    features = _bag(monkeypatch, tmp_path).dags["demo__features"]
    assert features.params.get_param("synthetic_rows").value == 4321  # what a scheduled run uses


@pytest.mark.parametrize("conf, message", [
    ({"domains": ["nope"]}, "is not one of"),
    ({"domains": []}, "should be non-empty"),
    ({"synthetic_rows": 0}, "less than the minimum"),
    ({"start": "01/02/2026"}, "is not a 'date'"),
])
def test_invalid_trigger_params_are_refused_with_a_message(monkeypatch, conf, message) -> None:
    from airflow.sdk.definitions.param import ParamsDict

    features = _bag(monkeypatch, ROOT / "configs").dags["demo__features"]
    params = ParamsDict(features.params)
    with pytest.raises(Exception, match=message):
        params.update(conf)
        params.validate()


def test_monitoring_rules_make_the_monitor_dag_start_retraining(monkeypatch, tmp_path: Path) -> None:
    """A config with monitoring.rules: its teacher DAG runs on new features or on a tripped rule
    (the monitor task's `retrain` outlet); without rules only the features start it."""
    data = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    data["name"] = "watched"
    data["monitoring"] = {"rules": [{"kind": "calibration", "low": 0.9, "high": 1.1}]}
    (tmp_path / "watched.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "demo.yaml").write_text((ROOT / "configs" / "demo.yaml").read_text())
    bag = _bag(monkeypatch, tmp_path)
    assert bag.import_errors == {}
    assert _assets(bag.dags["watched__train_teacher"]) == {"lattice.watched.features", "lattice.watched.retrain"}
    assert _assets(bag.dags["demo__train_teacher"]) == {"lattice.demo.features"}
    monitor = bag.dags["watched__monitor"]
    [task] = monitor.tasks
    assert task.task_id == "monitor" and {o.name for o in task.outlets} == {"lattice.watched.retrain"}
    assert {"end", "lookback_days", "period"} == set(monitor.params.dump())


def test_a_windowed_config_gates_again_when_the_next_day_arrives(monkeypatch, tmp_path: Path) -> None:
    """training.window: the challenger is judged on the day after its window, which arrives with
    the next features run, so the promote DAG runs on a new student or on new features."""
    data = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    data["name"] = "daily"
    data["training"]["window"] = "7d"
    (tmp_path / "daily.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "demo.yaml").write_text((ROOT / "configs" / "demo.yaml").read_text())
    bag = _bag(monkeypatch, tmp_path)
    assert bag.import_errors == {}
    assert _assets(bag.dags["daily__promote"]) == {"lattice.daily.student", "lattice.daily.features"}
    assert _assets(bag.dags["demo__promote"]) == {"lattice.demo.student"}


def test_a_gate_whose_day_has_not_arrived_waits_instead_of_failing(monkeypatch, tmp_path: Path) -> None:
    """The stage's 'no rows of that day' becomes NotYet (a skipped task in a DAG, a stop with exit 0
    in `lattice run`), never a rejection or a retried crash."""
    from lattice import stages
    from lattice.config import load_config
    from lattice.export.window import DayNotInTable
    from lattice.orchestration.graph import steps_of
    from lattice.orchestration.spec import dag_specs
    from lattice.orchestration.task_runner import GateRejected, NotYet, RunContext, execute
    from lattice.paths import Paths

    cfg = load_config(ROOT / "configs" / "demo.yaml")
    gate = next(s for s in steps_of(cfg, "promote") if s.gate)
    specs = {d.family: d.params for d in dag_specs(cfg)}["promote"]
    ctx = RunContext(cfg, Paths.for_config(cfg, tmp_path / "work"))

    def waiting(config, paths, dry_run=False):
        raise DayNotInTable("no rows of 2026-01-15 in the table")

    def rejected(config, paths, dry_run=False):
        return {"passed": False, "reasons": []}

    real = stages.get_stage
    for fake, error in ((waiting, NotYet), (rejected, GateRejected)):  # a real rejection stays one
        monkeypatch.setattr(stages, "get_stage", lambda n, fake=fake: fake if n == gate.stage else real(n))
        with pytest.raises(error, match="waits: no rows of 2026-01-15" if error is NotYet else ""):
            execute(ctx, gate, specs)
