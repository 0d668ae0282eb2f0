"""`fp8` in the config changes what training, export and the saved model do: the plan is made after
the warm-up, recorded in model.pt, fp8_plan.json and checkpoints, and used again by every stage
that rebuilds the model; `fp8.enabled: false` leaves training bit-equal to the FP32 model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lattice.models.saved import load_saved
from lattice.paths import Paths
from lattice.training.stages import train

pytestmark = pytest.mark.slow


def _with_fp8(cfg, **fp8):
    return cfg.model_copy(update={"fp8": cfg.fp8.model_copy(update=fp8)})


@pytest.fixture(scope="module")
def setup(tiny_demo):
    return tiny_demo("fp8", 5_000)


def _weights(paths: Paths, name: str) -> dict[str, torch.Tensor]:
    return torch.load(paths.model_dir(name) / "model.pt", weights_only=False)["state_dict"]


def test_fp8_disabled_is_bit_equal_to_fp32(setup) -> None:
    cfg, paths = setup
    train(cfg, paths, model="teacher@plain", nproc=1, epochs=1, progress=False)
    # every other fp8 key changed, but not enabled: nothing of FP8 may run
    off = _with_fp8(cfg, enabled=False, warmup_steps=3, probe_every=1, max_relative_error=1.0)
    train(off, paths, model="teacher@off", nproc=1, epochs=1, progress=False)
    a, b = _weights(paths, "teacher@plain"), _weights(paths, "teacher@off")
    # bit identity is the point: FP8 switched off must run the FP32 code path, the same ops in the same
    # order on this machine (tests/tolerances.py), so any FP8 work leaking in shows as a difference
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    blob = torch.load(paths.model_dir("teacher@off") / "model.pt", weights_only=False)
    assert blob["fp8"] is None and not (paths.model_dir("teacher@off") / "fp8_plan.json").exists()


def test_fp8_plan_is_made_after_warmup_recorded_and_rebuilt(setup) -> None:
    cfg, paths = setup
    on = _with_fp8(cfg, enabled=True, warmup_steps=4, probe_every=1, max_relative_error=0.08)
    train(on, paths, model="teacher@fp8", nproc=1, epochs=1, progress=False)
    d = paths.model_dir("teacher@fp8")
    plan = json.loads((d / "fp8_plan.json").read_text())
    chosen = [s for s in plan["sites"] if s["choice"] != "fp32"]
    assert chosen, "a generous threshold must switch some site to FP8"
    for s in plan["sites"]:  # the dispatcher never picks a site above the threshold
        if s["choice"] != "fp32":
            assert s["mere"][s["choice"]]["learned"] < on.fp8.max_relative_error
    saved = load_saved(d)
    assert saved.blob["fp8"] == plan and saved.blob.get("fp8_probe")
    from lattice.fp8.dispatch import find_sites

    # the rebuilt model may wrap the network (post-hoc calibration): site names are the network's
    net = getattr(saved.model, "net", saved.model)
    sites = find_sites(net)
    assert {n for n, m in sites.items() if m.recipe is not None} == {s["site"] for s in chosen}
    # the FP8 model is not the FP32 model: the same weights without the plan score differently
    plain = _weights(paths, "teacher@plain")
    assert any(not torch.equal(plain[k], saved.blob["state_dict"][k]) for k in plain)


def _checkpointed_fp8(root: Path) -> dict:
    """Rank 0's FP8 state in the newest checkpoint under `root` (DCP, read without a process group)."""
    import io

    import torch.distributed.checkpoint as dcp

    from lattice.training import checkpoint

    box = {"loop.rank0": {"state": "", "rng": torch.get_rng_state(), "fp8": b""}}
    dcp.load(box, checkpoint_id=str(checkpoint.latest(root)), no_dist=True)
    return torch.load(io.BytesIO(box["loop.rank0"]["fp8"]), weights_only=False)


def test_fp8_run_resumes_exactly(setup) -> None:
    cfg, paths = setup
    on = _with_fp8(cfg, enabled=True, warmup_steps=4, probe_every=1, max_relative_error=0.08)
    train(on, paths, model="teacher@fa", nproc=1, epochs=1, progress=False)
    cut = train(on, paths, model="teacher@fb", nproc=1, epochs=1, stop_after=6, progress=False)
    assert cut["interrupted"]
    assert _checkpointed_fp8(paths.model_dir("teacher@fb") / "checkpoint")["plan"] is not None  # cut after
    # the warm-up: the plan travels in the checkpoint
    train(on, paths, model="teacher@fb", nproc=1, epochs=1, resume=True, progress=False)
    a, b = _weights(paths, "teacher@fa"), _weights(paths, "teacher@fb")
    # a resumed run replays the exact saved state on the same machine: the same ops (tests/tolerances.py)
    assert all(torch.equal(a[k], b[k]) for k in a)
    pa = json.loads((paths.model_dir("teacher@fa") / "fp8_plan.json").read_text())
    pb = json.loads((paths.model_dir("teacher@fb") / "fp8_plan.json").read_text())
    assert [s["choice"] for s in pa["sites"]] == [s["choice"] for s in pb["sites"]]


def test_fp8_student_exports_with_its_sites(setup) -> None:
    from lattice.export.predictor import Predictor
    from lattice.export.stages import export_model

    cfg, paths = setup
    on = _with_fp8(cfg, enabled=True, warmup_steps=4, probe_every=1, max_relative_error=0.08)
    train(on, paths, model="student", nproc=1, epochs=1, progress=False)
    summary = export_model(on, paths, "student")
    meta = json.loads((paths.model_dir("student") / "export" / "metadata.json").read_text())
    plan = json.loads((paths.model_dir("student") / "fp8_plan.json").read_text())
    assert meta["fp8_sites"] == {s["site"]: s["choice"] for s in plan["sites"] if s["choice"] != "fp32"}
    assert meta["fp8_sites"], "the student has FP8 sites in its artifact"
    assert summary["max_abs_diff"] < 1e-4  # the artifact's FP8 sites compute what training's do
    pred = Predictor.load(paths.model_dir("student"))
    assert np.isfinite(next(iter(pred.predict_batch(pred.encode(pred_window(on, paths))).values()))).all()


def pred_window(cfg, paths):
    from lattice.export.window import load_window

    return load_window(cfg, paths, "test", max_rows=64)
