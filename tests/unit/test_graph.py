"""The pipeline graph: one declaration that the DAGs, the demo and `lattice run` read."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

import pytest

from lattice.config import load_config
from lattice.orchestration.graph import RUN_FAMILIES, TaskSpec, check_order, pipeline, select, steps_of
from lattice.orchestration.spec import dag_specs
from lattice.orchestration.task_runner import OutsideRange, interval_params

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo():
    return load_config(ROOT / "configs" / "demo.yaml")


def test_dags_are_the_graph_grouped_by_family(demo) -> None:
    steps = pipeline(demo)
    for spec in dag_specs(demo):
        assert [t.task_id for t in spec.tasks] == [s.task_id for s in steps if s.family == spec.family]
    # every step belongs to exactly one DAG: nothing runs only in the demo or only in Airflow
    assert sum(len(s.tasks) for s in dag_specs(demo)) == len(steps)


def test_every_read_is_written_earlier_or_comes_from_outside(demo) -> None:
    steps = pipeline(demo)
    written: set[str] = set()
    every_write = {a for s in steps for a in s.writes}
    for s in steps:
        assert all(a in written or a not in every_write for a in s.reads), s.task_id
        written |= set(s.writes)
    # the demo config's models: the teacher's baselines train on the table the features family writes
    assert {"model:separate", "model:pooled", "model:mmoe", "model:gbdt"} <= every_write


def test_a_step_that_reads_ahead_of_its_writer_is_refused() -> None:
    a = TaskSpec("train", "train", "", reads=("training_set",))
    b = TaskSpec("build", "training_set", "", writes=("training_set",))
    check_order([b, a])
    with pytest.raises(ValueError, match="reads \\['training_set'\\] before"):
        check_order([a, b])
    with pytest.raises(ValueError, match="repeat"):
        check_order([b, replace(b)])


def test_config_decides_the_optional_steps(demo) -> None:
    ids = [s.task_id for s in pipeline(demo)]
    assert "synthesize_raw_logs" in ids and "fit_hashing" not in ids
    bare = demo.model_copy(update={"synthetic": None})
    sparse = [f.model_copy(update={"hashing": "vocab"}) if i == 0 else f for i, f in enumerate(bare.features.sparse)]
    fitted = bare.model_copy(update={"features": bare.features.model_copy(update={"sparse": sparse})})
    ids = [s.task_id for s in pipeline(fitted)]
    assert "synthesize_raw_logs" not in ids
    # the id maps and the leaf ids' trees (models.leaves, on by default) are fitted first in the
    # teacher's family, on its days (the run's `end` and held-out share), right before it
    assert ids.index("materialize") < ids.index("fit_hashing") == ids.index("fit_trees") - 1
    assert ids.index("fit_trees") == ids.index("train_teacher") - 1
    steps = {s.task_id: s for s in pipeline(fitted)}
    for fit in ("fit_hashing", "fit_trees"):
        assert steps[fit].family == "train_teacher" and steps[fit].forward == {"end": "end", "validation_share": "validation_share"}
    # the neural baselines train on the teacher's days, so they read the same maps
    assert steps["train_separate"].forward["validation_share"] == "validation_share"
    assert [s.task_id for s in select(pipeline(fitted), "train_teacher", "train_teacher")] == [
        "fit_hashing", "fit_trees", "train_teacher"]
    m = fitted.models
    off = fitted.model_copy(update={"models": m.model_copy(update={"leaves": m.leaves.model_copy(update={"models": []})})})
    assert "fit_trees" not in [s.task_id for s in pipeline(off)]


def test_select_by_step_and_family(demo) -> None:
    steps = pipeline(demo)
    assert [s.task_id for s in select(steps, "distill", "promote")] == [
        "distill_student", "export_student", "register_student", "gate", "promote_challenger", "refresh_report"]
    assert [s.task_id for s in select(steps, "training_set", "train_teacher")][0] == "training_set"
    assert select(steps, "training_set", "train_teacher")[-1].task_id == "train_teacher"  # a step name, not the family
    # ... but a run from it starts at its family's first step: the trees of the teacher's days
    assert [s.task_id for s in select(steps, "train_teacher", "train_teacher")] == ["fit_trees", "train_teacher"]
    assert all(s.family in RUN_FAMILIES for s in select(steps))  # tune is never part of a run
    with pytest.raises(KeyError, match="no step or family 'bogus'"):
        select(steps, "bogus")
    with pytest.raises(KeyError, match="comes before"):
        select(steps, "promote", "features")


def test_scheduled_runs_take_their_day_manual_runs_keep_the_form(demo) -> None:
    specs = next(d.params for d in dag_specs(demo) if d.family == "features")
    form = {"start": "2026-01-01", "end": "2026-01-15"}
    day = (dt.datetime(2026, 1, 5, tzinfo=dt.timezone.utc), dt.datetime(2026, 1, 6, tzinfo=dt.timezone.utc))
    for kind in ("scheduled", "backfill"):
        assert interval_params(form, specs, kind, *day, demo.time_range) == {"start": "2026-01-05", "end": "2026-01-06"}
    assert interval_params(form, specs, "manual", *day, demo.time_range) == form
    # a form with an end only (the teacher's window end) takes the interval's end; one without dates is left alone
    teacher = next(d.params for d in dag_specs(demo) if d.family == "train_teacher")
    assert interval_params({"epochs": 1}, teacher, "scheduled", *day, demo.time_range) == {"epochs": 1, "end": "2026-01-06"}
    promote = next(d.params for d in dag_specs(demo) if d.family == "promote")
    assert interval_params({"dry_run": True}, promote, "scheduled", *day, demo.time_range) == {"dry_run": True}
    # clipped to time_range, and a day outside it is nothing to do (the DAG skips the task)
    wide = (dt.datetime(2025, 12, 30, tzinfo=dt.timezone.utc), dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc))
    assert interval_params(form, specs, "backfill", *wide, demo.time_range)["start"] == demo.time_range.start.isoformat()
    late = (dt.datetime(2027, 3, 1, tzinfo=dt.timezone.utc), dt.datetime(2027, 3, 2, tzinfo=dt.timezone.utc))
    with pytest.raises(OutsideRange, match="outside the config's time_range"):
        interval_params(form, specs, "scheduled", *late, demo.time_range)


def test_features_stage_runs_the_graphs_feature_jobs_in_its_order(demo) -> None:
    from pipelines.stages import chain

    assert chain(demo) == [s.stage for s in steps_of(demo, "features") if s.stage not in ("synth", "hashing_fit", "trees_fit")]


def test_cli_lists_the_graph(demo, capsys) -> None:
    from lattice.cli import main

    assert main(["run", str(ROOT / "configs" / "demo.yaml"), "--list", "--from", "distill"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split()[1] for ln in lines] == ["distill_student", "export_student", "register_student", "gate",
                                               "promote_challenger", "refresh_report"]
    assert main(["run", str(ROOT / "configs" / "demo.yaml"), "--list", "--to", "nowhere"]) == 2
