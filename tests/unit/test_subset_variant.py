"""Issue 37 finding 9: a domain/objective subset run from the train form is its own model variant.
It trains into `models/teacher__<variant>`, never over the full teacher; a subset distill reads the
subset teacher (and stops with what to run first when there is none); the subset's models register
under names of their own, never as the full teacher's latest version or the servable challenger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lattice.config import load_config
from lattice.orchestration.run_paths import subset_variant
from lattice.orchestration.spec import dag_specs, defaults
from lattice.orchestration.task_runner import DeterministicError, run_task

from test_dag_spec import _table, _with_stage

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "demo.yaml"


def test_variant_names() -> None:
    full_d, full_o = ["feed", "search", "video"], ["click", "conversion"]
    assert subset_variant(full_d, full_o, full_d, full_o) is None
    assert subset_variant(full_d, full_o, ["search", "feed"], full_o) == "feed_search"
    assert subset_variant(full_d, full_o, full_d, ["click"]) == "click"
    assert subset_variant(full_d, full_o, ["feed"], ["click"]) == "feed__click"


def test_a_subset_teacher_never_replaces_the_full_one_and_a_subset_distill_reads_it(tmp_path: Path, monkeypatch) -> None:
    from lattice.paths import Paths

    monkeypatch.setenv("LATTICE_WORKDIR", str(tmp_path / "work"))
    config = load_config(CONFIG)
    specs = {s.family: s for s in dag_specs(config)}
    home = Paths.for_config(config)
    _table(home.training_set, hive=False)
    full = home.model_dir("teacher")
    full.mkdir(parents=True)
    (full / "model.pt").write_text("the full teacher")

    def training(config, paths, model, epochs=None, nproc=None, **kw):
        out = paths.model_dir(model)
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.pt").write_text(f"{model} of {config.domain_names}")
        return {"model_dir": str(out)}

    _with_stage(monkeypatch, "train", training)
    teacher = specs["train_teacher"]
    params = {**defaults(teacher), "domains": ["feed", "search"]}
    train = next(t for t in teacher.tasks if t.task_id == "train_teacher")  # after fit_trees (models.leaves)
    out = run_task(CONFIG, train, params, teacher.params)
    assert full.joinpath("model.pt").read_text() == "the full teacher"  # untouched
    variant = home.model_dir("teacher__feed_search")
    assert out["summary"]["model_dir"] == str(variant) and out["variant"] == "feed_search"
    assert variant.joinpath("model.pt").read_text() == "teacher of ['feed', 'search']"

    seen = {}

    def distill(config, paths, epochs=None, nproc=None, **kw):
        seen["teacher"] = paths.model_dir("teacher")
        out = paths.model_dir("student")
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.pt").write_text("student")
        return {"model_dir": str(out)}

    _with_stage(monkeypatch, "distill", distill)
    dist = specs["distill"]
    run_task(CONFIG, dist.tasks[0], {**defaults(dist), "domains": ["feed", "search"]}, dist.params)
    assert seen["teacher"] == variant and home.model_dir("student__feed_search").joinpath("model.pt").exists()
    assert not home.model_dir("student").exists()

    # a subset nobody trained a teacher for: a clear stop, not the full teacher with the wrong heads
    with pytest.raises(DeterministicError, match=r"teacher__feed\b.*does not exist.*same domains"):
        run_task(CONFIG, dist.tasks[0], {**defaults(dist), "domains": ["feed"]}, dist.params)


@pytest.mark.slow  # MLflow registration and a Feast apply: about 30 s here
def test_a_subset_registers_under_its_own_names(tmp_path: Path) -> None:
    from lattice.orchestration.run_paths import RunPaths
    from lattice.paths import Paths
    from lattice.registry import CHALLENGER, ModelRegistry
    from lattice.registry.stages import register

    config = load_config(CONFIG)
    home = Paths.for_config(config, tmp_path / "wd")
    sub = RunPaths.make(home, variant="feed_search")
    d = sub.model_dir("student")
    (d / "export").mkdir(parents=True)
    (d / "export" / "model.pt").write_bytes(b"subset student" * 64)
    (d / "metrics.json").write_text(json.dumps({"macro": {"ne": 0.8}}))
    out = register(config, sub, "student")
    assert out["registered_model"] == "demo_ranker__feed_search" and not out["challenger"]
    full = ModelRegistry(config, home)
    assert full.by_alias(CHALLENGER) is None and full.latest("student") is None  # the servable model is untouched
