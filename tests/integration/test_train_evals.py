"""Validation inside the epoch (training.evals_per_epoch): it happens at the configured steps, the
weights kept are those of the best validation (not of an epoch end), patience counts validations,
and a resume from a checkpoint taken at or between validations ends bit for bit like an
uninterrupted run."""

from __future__ import annotations

import math

import pytest
import torch

from lattice.data.loader import table_rows
from lattice.paths import Paths
from lattice.training import distributed as D
from lattice.training import loop
from lattice.training.stages import train

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup(tiny_demo):
    cfg, paths = tiny_demo("evals", 6_000)
    cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={"evals_per_epoch": 4, "early_stopping_patience": 20})})
    return cfg, paths


def _weights(paths: Paths, name: str) -> dict[str, torch.Tensor]:
    return torch.load(paths.model_dir(name) / "model.pt", weights_only=False)["state_dict"]


def _points(steps: int, n: int) -> list[int]:
    return [p for p in (round(k * steps / n) for k in range(1, n)) if 0 < p < steps]


def test_validations_at_the_configured_steps(setup) -> None:
    cfg, paths = setup
    s = train(cfg, paths, model="teacher@e", nproc=1, epochs=2, progress=False)
    tr = cfg.training
    estimated = math.ceil(table_rows(paths.consolidated) * (1 - tr.validation_fraction - tr.test_fraction) / tr.batch_size)
    first = s["history"][0]["steps"]  # the steps the first epoch really took
    expected = _points(estimated, 4) + [first] + [first + p for p in _points(first, 4)] + [2 * first]
    assert [e["step"] for e in s["evals"]] == expected
    assert [e["epoch"] for e in s["evals"]] == [1] * 4 + [2] * 4
    assert [e["epochs_done"] for e in s["evals"]][3] == 1.0 and s["evals"][-1]["epochs_done"] == 2.0
    assert all(set(e["val_ne"]) == {f"{d}/{o}" for d, o in cfg.cells()} for e in s["evals"])
    # the epoch-end entries are the history's; the best is the minimum of all validations
    assert [h["val_macro_ne"] for h in s["history"]] == [s["evals"][3]["val_macro_ne"], s["evals"][7]["val_macro_ne"]]
    best = min(s["evals"], key=lambda e: e["val_macro_ne"])
    assert s["best_step"] == best["step"] and s["best_epoch"] == best["epoch"]
    # evals_per_epoch 1: the old behaviour, one validation per epoch end
    one = cfg.model_copy(update={"training": tr.model_copy(update={"evals_per_epoch": 1})})
    s1 = train(one, paths, model="teacher@e1", nproc=1, epochs=2, progress=False)
    assert [e["step"] for e in s1["evals"]] == [first, 2 * first]
    # patience 20 never runs out in 8 validations: the run says it used every epoch
    assert s["stopped_early"] is False and s["epochs_run"] == 2
    assert s["stop_reason"].startswith("all 2 planned epoch(s) ran; kept ")
    assert [e["validation"] for e in s["evals"]] == [1, 2, 3, 4] * 2


def test_keeps_the_best_validation_and_stops_on_patience(setup, monkeypatch) -> None:
    """A validation NE made to be best at the 3rd validation (inside epoch 1) and worse after it:
    the saved weights are those of that step, and patience 2 stops 3 validations later."""
    cfg, paths = setup
    cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={"early_stopping_patience": 2})})
    snapshots: list[tuple[int, dict]] = []
    real = loop.Trainer.validate

    def fake(self):
        val = real(self)
        snapshots.append((self.state.global_step, D.full_state_dict(self.model)))
        i = len(snapshots)
        ne = 1.0 - 0.01 * i if i <= 3 else 0.98 + 0.001 * i  # best at the 3rd, then worse
        return {k: ne for k in val}

    monkeypatch.setattr(loop.Trainer, "validate", fake)
    s = train(cfg, paths, model="teacher@best", nproc=1, epochs=3, progress=False)
    assert len(s["evals"]) == 6 and len(snapshots) == 6  # best at 3, then 3 without gain: stop
    step3 = snapshots[2][0]
    assert s["best_step"] == step3 and s["best_epoch"] == 1 and s["global_steps"] == snapshots[-1][0]
    assert s["evals"][2]["val_macro_ne"] == pytest.approx(0.97)
    kept = _weights(paths, "teacher@best")
    assert kept.keys() == snapshots[2][1].keys()
    for k in kept:  # the kept best is a copy of the weights at that step: no arithmetic
        assert torch.equal(kept[k], snapshots[2][1][k]), k
    assert any(not torch.equal(kept[k], snapshots[-1][1][k]) for k in kept)  # training did go on past it
    # the run's record says where it stopped and which validation it kept, in every output
    import json

    assert s["stopped_early"] is True and s["kept"]["epoch"] == 1 and s["kept"]["validation"] == 3
    assert s["stop_reason"].startswith("patience ran out at epoch 2, validation 2 of 4")
    assert "3 validation(s) in a row" in s["stop_reason"] and "kept epoch 1, validation 3 of 4" in s["stop_reason"]
    d = paths.model_dir("teacher@best")
    assert json.loads((d / "metrics.json").read_text())["training"]["stop_reason"] == s["stop_reason"]
    assert json.loads((d / "history.json").read_text())["stop"]["stop_reason"] == s["stop_reason"]


@pytest.mark.parametrize("cut", ["at_validation", "between"])
def test_resume_mid_epoch_with_validations(setup, cut) -> None:
    cfg, paths = setup
    full_name, cut_name = "teacher@full", f"teacher@cut_{cut}"
    if not (paths.model_dir(full_name) / "model.pt").exists():
        train(cfg, paths, model=full_name, nproc=1, epochs=2, progress=False)
    full = torch.load(paths.model_dir(full_name) / "model.pt", weights_only=False)
    import json

    evals = json.loads((paths.model_dir(full_name) / "history.json").read_text())["evals"]
    in_epoch = [e["step"] for e in evals if e["epochs_done"] not in (1.0, 2.0)]
    stop = in_epoch[4] if cut == "at_validation" else in_epoch[4] + 1  # inside the second epoch
    r = train(cfg, paths, model=cut_name, nproc=1, epochs=2, stop_after=stop, progress=False)
    assert r["interrupted"] and r["global_step"] == stop
    resumed = train(cfg, paths, model=cut_name, nproc=1, epochs=2, resume=True, progress=False)
    b = _weights(paths, cut_name)
    for k in full["state_dict"]:  # the exact saved state replayed on the same machine: the same ops (tests/tolerances.py)
        assert torch.equal(full["state_dict"][k], b[k]), k
    assert [(e["step"], e["val_macro_ne"]) for e in resumed["evals"]] == [(e["step"], e["val_macro_ne"]) for e in evals]
