"""training.device and the torchrun layout, without a GPU or a launch: the device choice, the
backend, the sharding kinds per device, a 2-GPU sharding plan built on this CPU machine, the
multi-node torchrun commands from a scale-out profile, and reading torchrun's failure summary."""

from __future__ import annotations

import json

from pathlib import Path

import pytest
import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

from lattice.config import load_config
from lattice.deploy.profile import write_profile
from lattice.models import build_model
from lattice.training import distributed as D
from lattice.training import launch
from lattice.training.tiny import tiny

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config():
    return tiny(load_config(ROOT / "configs" / "demo.yaml"))


@pytest.mark.parametrize("cuda, choice, want", [(False, "auto", "cpu"), (True, "auto", "cuda"), (True, "cpu", "cpu"),
                                                (False, "cpu", "cpu"), (True, "cuda", "cuda")])
def test_device_choice(monkeypatch, cuda, choice, want) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setenv("LOCAL_RANK", "1")
    device = D.choose_device(choice)
    assert device.type == want
    assert D.backend_for(device) == ("nccl" if want == "cuda" else "gloo")
    if want == "cuda":
        assert device.index == 1  # each rank its own GPU


def test_cuda_without_a_gpu_says_what_to_do(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="LATTICE_GPU=1 infra/setup.sh"):
        D.choose_device("cuda")


def test_config_default_is_auto(config) -> None:
    assert config.training.device == "auto"
    assert {"row_wise", "table_row_wise"} <= set(config.training.sharding_types)


def test_row_wise_kinds_only_on_cuda(config) -> None:
    kinds = config.training.sharding_types
    assert D.sharding_types(kinds, "cpu") == ["table_wise", "column_wise", "data_parallel"]
    assert D.sharding_types(kinds, "cuda") == kinds


def test_to_device_leaves_cpu_batches_alone() -> None:
    batch = object()
    assert D.to_device(batch, torch.device("cpu")) is batch


@pytest.mark.parametrize("kind", ["row_wise", "table_row_wise"])
def test_two_gpu_plan_uses_gpu_sharding_and_fused_kernels(config, kind) -> None:
    """Planned for a 2-GPU topology on this CPU machine (planning needs no device; running does)."""
    model = build_model(config, "teacher", 4)
    planner = D.planner_for(model, 2, D.sharding_types([kind], "cuda"), "cuda", local_world=2)
    plan = planner.plan(model, [EmbeddingBagCollectionSharder()]).plan["sparse.ebc"]
    assert {p.sharding_type for p in plan.values()} == {kind}
    assert {p.compute_kernel for p in plan.values()} == {"fused"}
    assert all(p.ranks == [0, 1] for p in plan.values())
    assert all(str(s.placement).endswith("cuda:" + str(s.placement.rank())) for p in plan.values()
               for s in p.sharding_spec.shards)


def test_pinned_kinds_survive_another_world(config) -> None:
    model = build_model(config, "teacher", 4)
    pinned = {t: "table_wise" for t in D.table_names(model)}
    planner = D.planner_for(model, 2, ["data_parallel"], "cpu", pinned=pinned, local_world=2)
    plan = planner.plan(model, [EmbeddingBagCollectionSharder()])
    assert {p.sharding_type for p in plan.plan["sparse.ebc"].values()} == {"table_wise"}


def _scaled(config, tmp_path, monkeypatch, torchrun: dict):
    path = tmp_path / "profile.json"
    write_profile(path, {"spark": {"master": "local[2]"}, "torchrun": torchrun})
    monkeypatch.setenv("LATTICE_PROFILE_FILE", str(path))
    return config.model_copy(update={"deployment": config.deployment.model_copy(update={"profile": "scale-out"})})


def test_embedded_command_is_unchanged(config) -> None:
    lay = launch.layout(config, 2, "run")
    cmd = lay.command(Path("spec.json"))
    # the run's own --log-dir, where its ranks' error files go (lattice.training.launch.rank_errors)
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--log-dir", str(Path("rank_errors") / "node0")]
    assert cmd[5:8] == ["--nproc_per_node=2", "--nnodes=1", "--master_addr=127.0.0.1"]
    assert cmd[8].startswith("--master_port=") and cmd[9:] == ["-m", "lattice.training.worker", "spec.json"]


def test_cluster_node_command(config, tmp_path, monkeypatch) -> None:
    cfg = _scaled(config, tmp_path, monkeypatch, {"nnodes": 4, "nproc_per_node": 8, "rdzv_endpoint": "10.0.0.1:29400"})
    lay = launch.layout(cfg, None, "lattice-demo-teacher")
    assert lay.world == 32 and not lay.local_nodes
    cmd = " ".join(lay.command(Path("spec.json"), node_rank=3))
    assert ("--nnodes 4 --node-rank 3 --rdzv-backend c10d --rdzv-endpoint 10.0.0.1:29400 --rdzv-id lattice-demo-teacher "
            "--nproc-per-node 8 --max-restarts 0 -m lattice.training.worker spec.json") in cmd


def test_local_nodes_bind_to_loopback(config, tmp_path, monkeypatch) -> None:
    cfg = _scaled(config, tmp_path, monkeypatch, {"nnodes": 2, "nproc_per_node": 1, "local_nodes": True})
    lay = launch.layout(cfg, None, "r")
    assert lay.rdzv_endpoint.startswith("127.0.0.1:")
    node0, node1 = (" ".join(lay.command(Path("s"), i)) for i in range(2))
    assert "--rdzv-conf is_host=1 --local-addr 127.0.0.1" in node0 and "is_host=0" in node1


def test_multi_node_without_endpoint_is_refused(config, tmp_path, monkeypatch) -> None:
    cfg = _scaled(config, tmp_path, monkeypatch, {"nnodes": 2})
    with pytest.raises(ValueError, match="rdzv_endpoint"):
        launch.layout(cfg, None, "r")


SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
lattice.training.worker FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_19:00:00
  host      : box
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 4242)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4242
============================================================"""


def test_failure_summary_names_rank_node_and_resume() -> None:
    failure = launch.failure_from(SUMMARY.splitlines(), node=1)
    assert failure == launch.Failure(rank=3, local_rank=1, exitcode=-9, node=1)
    broken_peer = launch.Failure(rank=0, local_rank=0, exitcode=1, node=0)
    assert launch.pick([broken_peer, failure]) is failure
    lay = launch.Launch(2, 2, "127.0.0.1:1", True, "r")
    err = launch.RankFailed("teacher", lay, failure, 1, "lattice train c.yaml --model teacher --resume")
    assert "rank 3 (node 1, local rank 1) died: killed by signal 9" in str(err)
    # the killed rank wrote no error file; its peer's (a broken collective) does not replace it
    peer = launch.RankError(0, 0, "RuntimeError: Connection closed by peer", "", 5)
    assert "killed by signal 9" in str(launch.RankFailed("teacher", lay, failure, 1, "r", error=peer))
    assert str(err).endswith("Resume from the last checkpoint with: lattice train c.yaml --model teacher --resume")


TERMINATED_ROOT = """Failures:
[1]:
  time      : 2026-12-05_12:36:11
  host      : box
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4243)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4243
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-05_12:36:11
  host      : box
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 4242)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 4242
============================================================"""


def test_a_survivor_torchrun_terminated_is_not_named_as_the_cause() -> None:
    """Seen on CI: rank 1 was SIGKILLed, torchrun SIGTERMed rank 0 and listed it as the root cause."""
    assert launch.failure_from(TERMINATED_ROOT.splitlines(), node=0) == launch.Failure(1, 1, -9, 0)
    termed = launch.Failure(rank=0, local_rank=0, exitcode=-15, node=0)
    killed = launch.Failure(rank=2, local_rank=0, exitcode=-9, node=1)
    assert launch.pick([termed, killed]) is killed
    assert launch.pick([launch.Failure(0, 0, 1, 0), termed]) is termed


def test_a_long_root_cause_traceback_does_not_hide_the_killed_rank(monkeypatch) -> None:
    """Seen on CI (stop 55): rank 1 was SIGKILLed, rank 0's broken collective became the root
    cause, and its long traceback pushed rank 1's entry out of a 40-line stderr tail."""
    import logging
    import os
    import sys

    from lattice import relay

    frames = "\n".join(f'    File "loop.py", line {i}, in step\n      x = y()' for i in range(120))
    summary = TERMINATED_ROOT.split("Root Cause")[0] + f"""Root Cause (first observed failure):
[0]:
  time      : 2026-12-07_17:29:15
  host      : box
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 4242)
  error_file: /tmp/x/error.json
  traceback : Traceback (most recent call last):
{frames}
  RuntimeError: Connection closed by peer
============================================================"""
    monkeypatch.setattr(relay, "is_terminal", lambda stream: False)
    child = f"import sys; sys.stderr.write({summary!r}); sys.exit(1)"
    code, tail = relay.run_child([sys.executable, "-c", child], dict(os.environ), logging.getLogger("t"),
                                 launch.SUMMARY_TAIL_LINES)
    assert code == 1 and len(summary.splitlines()) > 200
    killed = launch.failure_from(tail, node=0)
    assert killed == launch.Failure(1, 1, -9, 0)
    lay = launch.Launch(1, 2, None, False, "r")
    peer = launch.RankError(0, 0, "RuntimeError: Connection closed by peer", "", 5)
    assert "rank 1 (node 0, local rank 1) died: killed by signal 9" in str(
        launch.RankFailed("teacher", lay, launch.pick([killed]), 1, "r", error=peer))


@pytest.mark.slow
def test_a_rank_that_raises_is_named_by_its_error_file(tmp_path) -> None:
    """Two real ranks under torchrun whose run spec cannot be read: each rank's `record` writes
    torchelastic's error file, and the failure names the exception and where it was raised
    instead of quoting stderr; a later successful run would find no stale file."""
    from lattice.training.stages import _run_torchrun

    spec = tmp_path / "model" / "run_spec.json"
    spec.parent.mkdir()
    spec.write_text('{"not": "a run spec"}')
    stale = launch.error_dir(spec, 0) / "old_x" / "attempt_0" / "0"
    stale.mkdir(parents=True)
    (stale / "error.json").write_text('{"message": {"message": "OldError: a previous run", "extraInfo": {"timestamp": "1"}}}')
    lay = launch.Launch(1, 2, None, False, "r")
    with pytest.raises(launch.RankFailed) as caught:
        _run_torchrun(lay, spec, "teacher", "lattice train c.yaml --model teacher --resume", None)
    err = caught.value
    assert err.error is not None and err.error.node == 0 and err.error.local_rank in (0, 1)
    assert "OldError" not in str(err)
    assert f"node 0, local rank {err.error.local_rank} raised" in str(err)
    assert "spec.py" in str(err) and "traceback of the first failed rank" in str(err)
    assert len(launch.rank_errors(launch.error_dir(spec, 0), 0)) == 2  # one file per rank, both read


def test_error_files_are_read_first_failure_first(tmp_path) -> None:
    for rank, (ts, msg) in enumerate([(20, "RuntimeError: gloo connection closed"), (10, "ValueError: bad table")]):
        f = tmp_path / "job_1" / "attempt_0" / str(rank) / "error.json"
        f.parent.mkdir(parents=True)
        f.write_text(json.dumps({"message": {"message": msg, "extraInfo": {
            "py_callstack": f'Traceback:\n  File "/x/loop.py", line {rank + 7}, in run\n{msg}\n', "timestamp": str(ts)}}}))
    (tmp_path / "job_1" / "attempt_0" / "2").mkdir()
    (tmp_path / "job_1" / "attempt_0" / "2" / "error.json").write_text("{cut sho")  # killed mid-write: skipped
    errors = launch.rank_errors(tmp_path, node=1)
    assert [e.local_rank for e in errors] == [1, 0]
    assert errors[0].describe() == 'node 1, local rank 1 raised ValueError: bad table (File "/x/loop.py", line 8, in run)'


def test_nproc_zero_is_chosen_from_the_machine(config, monkeypatch) -> None:
    """training.nproc 0 (the default): one process on CPU, one rank per GPU on CUDA; --nproc wins."""
    auto = config.model_copy(update={"training": config.training.model_copy(update={"nproc": 0, "device": "auto"})})
    assert type(config.training).model_fields["nproc"].default == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert launch.layout(auto, None, "r").world == 1 and launch.layout(auto, 0, "r").world == 1
    assert launch.layout(auto, 2, "r").world == 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert launch.layout(auto, None, "r").world == 4
    cpu = auto.model_copy(update={"training": auto.training.model_copy(update={"device": "cpu"})})
    assert launch.layout(cpu, None, "r").world == 1
    fixed = auto.model_copy(update={"training": auto.training.model_copy(update={"nproc": 3})})
    assert launch.layout(fixed, None, "r").world == 3
