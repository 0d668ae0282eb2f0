"""A warm start's `last` parent through the executor: a DAG task, `lattice run` and the demo train
into a scratch folder (lattice.orchestration.run_paths), so the parent is the real model folder's
model, not the empty scratch one's (which made every such run train from scratch)."""

from __future__ import annotations

from pathlib import Path

import torch

from lattice.config import load_config
from lattice.orchestration.run_paths import RunPaths
from lattice.paths import Paths
from lattice.training.warm_start import find_parent

ROOT = Path(__file__).resolve().parents[2]


def test_a_staged_run_finds_the_real_folders_model(tmp_path):
    config = load_config(ROOT / "configs" / "demo.yaml")
    home = Paths(workdir=tmp_path / "wd", data_root=tmp_path / "raw")
    real = home.model_dir("teacher")
    real.mkdir(parents=True)
    torch.save({"lineage": {"days_seen": ["2026-01-01", "2026-01-02"]}}, real / "model.pt")
    staged = RunPaths.make(home, staged="teacher").ensure()
    assert staged.model_dir("teacher") != real and not (staged.model_dir("teacher") / "model.pt").exists()
    parent = find_parent(config, staged, "teacher", "last")
    assert parent is not None and parent.folder == real
    assert parent.days_seen == ["2026-01-01", "2026-01-02"]
    # the student's folder holds nothing yet: no parent, a run from scratch
    assert find_parent(config, RunPaths.make(home, staged="student"), "student", "last") is None
