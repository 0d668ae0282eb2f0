"""Distributed checkpoints and multi-node torchrun: a DCP checkpoint loads on another world size
with the same model and optimizer state (2 -> 1, 1 -> 2) and bit-identically on the same one; a
killed rank fails the run naming the rank and the resume command, and `--resume` then finishes it;
two loopback "nodes" train the same model as one node with two processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from lattice.paths import Paths
from lattice.training import checkpoint
from lattice.training.launch import RankFailed, free_port
from lattice.training.stages import train

sys.path.insert(0, str(Path(__file__).parent))
import _reshard_probe  # noqa: E402

pytestmark = pytest.mark.slow
PROBE = Path(__file__).parent / "_reshard_probe.py"
CUT = 22  # optimizer steps: past the first epoch's end (~19 steps), so the best weights are saved too


@pytest.fixture(scope="module")
def setup(tiny_demo):
    return tiny_demo("scaleout", 6_000)


@pytest.fixture(scope="module")
def two_ranks(setup):
    """One uninterrupted epoch on one node with 2 ranks: the reference of two tests below."""
    cfg, paths = setup
    return train(cfg, paths, model="teacher@f2", nproc=2, epochs=1, progress=False)


def _flat(d: dict, pre: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{pre}{k}.") if isinstance(v, dict) else {pre + k: v})
    return out


def _full(folder: Path, tmp: Path) -> dict:
    """Every entry of a DCP checkpoint, tensors unsharded."""
    dcp_to_torch_save(folder, tmp)
    return _flat(torch.load(tmp, weights_only=False))


def _resaved(paths: Paths, model: str, nproc: int, out: Path) -> Path:
    """Load the model's latest checkpoint into `nproc` fresh ranks and save it again untouched."""
    spec = paths.model_dir(model) / "run_spec.json"
    if nproc == 1:
        _reshard_probe.resave(str(spec), str(out))
    else:
        subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--nnodes=1",
                        "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(PROBE), str(spec), str(out)],
                       check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return checkpoint.latest(out)


def _assert_same_state(a: dict, b: dict, saved_world: int) -> None:
    tensors = [k for k in a if k.split(".")[0] in ("model", "fused_opt", "dense_opt", "best")]
    assert any(k.startswith("best.") for k in tensors) and any(k.startswith("fused_opt.") for k in tensors)
    assert any(k.startswith("dense_opt.") and k.endswith("exp_avg_sq") for k in tensors)
    assert set(tensors) == {k for k in b if k.split(".")[0] in ("model", "fused_opt", "dense_opt", "best")}
    for k in tensors:  # resharding moves bytes, it computes nothing: bit identity (tests/tolerances.py)
        assert torch.equal(a[k], b[k]), k
    loop_a, loop_b = json.loads(a["loop.rank0.state"]), json.loads(b["loop.rank0.state"])
    for k in ("global_step", "epoch", "step_in_epoch", "best_ne", "best_step", "history", "evals"):
        assert loop_a[k] == loop_b[k], k
    # the partial epoch's loss sums over all ranks are the same
    total = lambda flat, n, key: sum(json.loads(flat[f"loop.rank{r}.state"])[key] for r in range(n))  # noqa: E731
    new_world = json.loads(b["meta"])["world_size"]
    assert total(a, saved_world, "epoch_examples") == total(b, new_world, "epoch_examples") > 0
    assert total(a, saved_world, "epoch_loss") == pytest.approx(total(b, new_world, "epoch_loss"), rel=1e-12)


def _weights(paths: Paths, name: str) -> dict[str, torch.Tensor]:
    return torch.load(paths.model_dir(name) / "model.pt", weights_only=False)["state_dict"]


def test_two_rank_checkpoint_resumes_on_one(setup, tmp_path) -> None:
    cfg, paths = setup
    cut = train(cfg, paths, model="teacher@w2", nproc=2, epochs=2, stop_after=CUT, progress=False)
    assert cut["interrupted"]
    saved = checkpoint.latest(paths.model_dir("teacher@w2") / "checkpoint")
    assert json.loads(_full(saved, tmp_path / "a.pt")["meta"])["world_size"] == 2
    again = _resaved(paths, "teacher@w2", 1, tmp_path / "one")
    _assert_same_state(_full(saved, tmp_path / "a.pt"), _full(again, tmp_path / "b.pt"), saved_world=2)
    done = train(cfg, paths, model="teacher@w2", nproc=1, epochs=2, resume=True, progress=False)
    assert done["world_size"] == 1 and done["global_steps"] > CUT and done["epochs_run"] == 2


def test_one_rank_checkpoint_resumes_on_two(setup, tmp_path) -> None:
    cfg, paths = setup
    train(cfg, paths, model="teacher@w1", nproc=1, epochs=2, stop_after=CUT, progress=False)
    saved = checkpoint.latest(paths.model_dir("teacher@w1") / "checkpoint")
    again = _resaved(paths, "teacher@w1", 2, tmp_path / "two")
    b = _full(again, tmp_path / "b.pt")
    assert json.loads(b["meta"])["world_size"] == 2
    _assert_same_state(_full(saved, tmp_path / "a.pt"), b, saved_world=1)
    done = train(cfg, paths, model="teacher@w1", nproc=2, epochs=2, resume=True, progress=False)
    assert done["world_size"] == 2 and done["epochs_run"] == 2


def test_two_rank_resume_is_bit_identical(setup, two_ranks) -> None:
    cfg, paths = setup
    full = two_ranks
    cut = train(cfg, paths, model="teacher@c2", nproc=2, epochs=1, stop_after=9, progress=False)
    assert cut["interrupted"]
    resumed = train(cfg, paths, model="teacher@c2", nproc=2, epochs=1, resume=True, progress=False)
    a, b = _weights(paths, "teacher@f2"), _weights(paths, "teacher@c2")
    assert a.keys() == b.keys()
    for k in a:  # the exact saved state replayed on the same machine and ranks: the same ops (tests/tolerances.py)
        assert torch.equal(a[k], b[k]), k
    assert full["history"][0]["train_loss"] == resumed["history"][0]["train_loss"]
    assert full["macro"] == resumed["macro"]


def _ranks() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "lattice.training.worker" in " ".join(p.cmdline()) and "torch.distributed.run" not in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _kill_rank_mid_run(cfg, paths: Paths, model: str, nproc: int | None) -> tuple[RankFailed, float]:
    """Train in a thread, SIGKILL rank 1 once the first checkpoint is down; (the error, seconds
    from the kill to the error)."""
    # patience high and epochs many: the run is still training when a rank is killed
    cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={"early_stopping_patience": 50})})
    ckpt = paths.model_dir(model) / "checkpoint"
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["summary"] = train(cfg, paths, model=model, nproc=nproc, epochs=30, checkpoint_every=4, progress=False)
        except Exception as exc:  # noqa: BLE001 - the test reads it
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 90
    while checkpoint.latest(ckpt) is None and worker.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    victims = [p for p in _ranks() if p.environ().get("RANK") == "1"]
    assert victims, f"no rank 1 process found ({outcome})"
    victims[0].kill()  # SIGKILL
    killed = time.monotonic()
    worker.join(timeout=120)
    assert not worker.is_alive()
    assert isinstance(outcome.get("error"), RankFailed), outcome
    took = time.monotonic() - killed
    time.sleep(1)
    assert not _ranks(), "orphan ranks"
    return outcome["error"], took


def test_killed_rank_names_it_and_resume_finishes(setup) -> None:
    cfg, paths = setup
    model = "teacher@k"
    err, took = _kill_rank_mid_run(cfg, paths, model, nproc=2)
    assert took < 60
    assert "rank 1 (node 0, local rank 1) died: killed by signal 9" in str(err)
    assert f"lattice train {cfg.source_file} --model {model} --resume --nproc 2 --epochs 30 --workdir {paths.workdir}" in str(err)
    step = int(checkpoint.latest(paths.model_dir(model) / "checkpoint").name.split("-")[1])
    done = train(cfg, paths, model=model, nproc=1, epochs=2, resume=True, progress=False)
    assert done["world_size"] == 1 and done["global_steps"] > step


def _two_local_nodes(cfg, tmp_path: Path, monkeypatch):
    from lattice.deploy.profile import write_profile

    profile = tmp_path / "profile.json"
    write_profile(profile, {"spark": {"master": "local[2]"},
                            "torchrun": {"nnodes": 2, "nproc_per_node": 1, "local_nodes": True}})
    monkeypatch.setenv("LATTICE_PROFILE_FILE", str(profile))
    return cfg.model_copy(update={"deployment": cfg.deployment.model_copy(update={"profile": "scale-out"})})


@pytest.mark.scaleout
def test_killed_rank_on_a_second_node(setup, tmp_path, monkeypatch) -> None:
    cfg, paths = setup
    scaled = _two_local_nodes(cfg, tmp_path, monkeypatch)
    err, took = _kill_rank_mid_run(scaled, paths, "teacher@kn", nproc=None)
    assert took < 60
    assert "on 2 ranks (2 node(s))" in str(err)
    assert "rank 1 (node 1, local rank 0) died: killed by signal 9" in str(err)
    assert "--model teacher@kn --resume --epochs 30" in str(err)


def test_old_per_rank_checkpoints_ask_to_retrain(setup) -> None:
    cfg, paths = setup
    old = paths.model_dir("pooled") / "checkpoint"
    old.mkdir(parents=True, exist_ok=True)
    torch.save({"world_size": 1}, old / "rank0.pt")
    with pytest.raises(checkpoint.CheckpointError, match="older Lattice .* retrain 'pooled' without --resume"):
        train(cfg, paths, model="pooled", nproc=1, epochs=1, resume=True, progress=False)


@pytest.mark.scaleout
def test_two_loopback_nodes_train_like_one_node_with_two_ranks(setup, two_ranks, tmp_path, monkeypatch) -> None:
    cfg, paths = setup
    one = two_ranks
    two = train(_two_local_nodes(cfg, tmp_path, monkeypatch), paths, model="teacher@n2", epochs=1, progress=False)
    assert one["world_size"] == two["world_size"] == 2
    m1 = json.loads((paths.model_dir("teacher@f2") / "metrics.json").read_text())
    m2 = json.loads((paths.model_dir("teacher@n2") / "metrics.json").read_text())
    for cell in m1["cells"]:
        assert m2["cells"][cell]["ne"] == pytest.approx(m1["cells"][cell]["ne"], rel=1e-5), cell
    assert two["history"][0]["train_loss"] == pytest.approx(one["history"][0]["train_loss"], rel=1e-6)
    # the same ranks see the same batches: the weights agree up to the collectives' summation order
    w1, w2 = _weights(paths, "teacher@f2"), _weights(paths, "teacher@n2")
    assert w1.keys() == w2.keys()
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-5, atol=1e-6, msg=k)
    assert not _ranks()
