"""Checkpoints restore model, optimizers and data position: an interrupted-then-resumed run ends
with exactly the weights of an uninterrupted one. Also the distillation hook: teacher scores by
example_id feed the student's training."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from lattice.paths import Paths
from lattice.training.stages import score, train

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup(tiny_demo):
    return tiny_demo("resume", 6_000)


def _weights(paths: Paths, name: str) -> dict[str, torch.Tensor]:
    return torch.load(paths.model_dir(name) / "model.pt", weights_only=False)["state_dict"]


def test_resume_equals_uninterrupted(setup) -> None:
    cfg, paths = setup
    full = train(cfg, paths, model="teacher@a", nproc=1, epochs=2, progress=False)
    cut = train(cfg, paths, model="teacher@b", nproc=1, epochs=2, stop_after=9, progress=False)
    assert cut["interrupted"] and cut["global_step"] == 9  # mid first epoch
    assert not (paths.model_dir("teacher@b") / "model.pt").exists()
    resumed = train(cfg, paths, model="teacher@b", nproc=1, epochs=2, resume=True, progress=False)
    a, b = _weights(paths, "teacher@a"), _weights(paths, "teacher@b")
    assert a.keys() == b.keys()
    for k in a:  # the exact saved state replayed on the same machine: the same ops (tests/tolerances.py)
        assert torch.equal(a[k], b[k]), k
    assert [round(e["train_loss"], 10) for e in full["history"]] == [round(e["train_loss"], 10) for e in resumed["history"]]
    # and training did move the weights
    fresh = train(cfg, paths, model="teacher@c", nproc=1, epochs=1, stop_after=1, progress=False)
    assert fresh["interrupted"]


def test_teacher_scores_feed_the_student(setup) -> None:
    cfg, paths = setup
    if not (paths.model_dir("teacher@a") / "model.pt").exists():
        train(cfg, paths, model="teacher@a", nproc=1, epochs=1, progress=False)
    out = score(cfg, paths, "teacher@a", split="train", progress=False)
    scores = pd.read_parquet(out)
    assert list(scores.columns) == ["example_id", "domain", "p_click", "p_conversion", "split"]
    assert set(scores.split) == {"train"}
    assert scores["p_click"].between(0, 1).all() and scores["example_id"].is_unique
    summary = train(cfg, paths, model="student", nproc=1, epochs=1, teacher_scores=out, progress=False)
    metrics = json.loads((paths.model_dir("student") / "metrics.json").read_text())
    assert summary["cost"]["params"] < _cost(paths, "teacher@a")["params"]  # the same network, smaller
    assert set(metrics["cells"]) == {f"{d}/{o}" for d, o in cfg.cells()}


def _cost(paths: Paths, name: str) -> dict:
    return json.loads((paths.model_dir(name) / "metrics.json").read_text())["cost"]
