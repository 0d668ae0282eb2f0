"""Training checkpoints as torch.distributed.checkpoint (DCP) folders, resumable at any world size.

One checkpoint is `checkpoint/step-<global step>/` (DCP's `.metadata` plus one data file per
rank) and `checkpoint/latest` names the newest complete one: it is rewritten only after every
rank's save returned, so a rank killed mid-save leaves the previous checkpoint in force.

What goes in, under these top-level keys:
  model      the DMP state dict: ShardedTensors for sharded tables, plain tensors for
             data-parallel tables and the dense part; DCP writes each rank's shards and one copy
             of replicated tensors, and reshards on load to whatever plan the new world has
  fused_opt  the tables' in-backward (fused) optimizer state, ShardedTensors like the tables
  dense_opt  Adam's state keyed by parameter name (its own keys are positions in a list)
  best       the best validation's weights, in the model's layout (absent before a validation)
  meta       world size and the plan's sharding type per table (a resume pins them, see
             distributed.planner_for)
  loop.rank<r>  each rank's loop state (step, epoch, data position, its partial loss sums, RNG,
             FP8 probe): a resume on another world size folds the partial sums into rank 0
"""

from __future__ import annotations

import io
import json
import shutil
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torchrec.optim.optimizers import in_backward_optimizer_filter

from lattice.training import distributed as D

if TYPE_CHECKING:
    from lattice.training.loop import Trainer

FORMAT = 2  # 1: the old per-rank torch.save files (checkpoint/rank<N>.pt)


class CheckpointError(ValueError):
    """A checkpoint this trainer cannot resume from."""


def latest(root: Path) -> Path | None:
    """The newest complete checkpoint folder under `root` (None: there is none)."""
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    folder = root / pointer.read_text().strip()
    return folder if (folder / ".metadata").is_file() else None


def check_resumable(root: Path, model: str) -> None:
    """Raise with what to do when `root` holds nothing `--resume` can read."""
    if latest(root) is not None:
        return
    if any(root.glob("rank*.pt")):
        raise CheckpointError(f"{root} holds per-rank checkpoints of an older Lattice (rank<N>.pt), which this "
                              f"version does not read: retrain {model!r} without --resume")
    raise FileNotFoundError(f"--resume: no checkpoint of {model!r} under {root}; train without --resume to start from scratch")


def read_meta(folder: Path) -> dict:
    """The checkpoint's `meta` entry (readable without a process group)."""
    box: dict[str, Any] = {"meta": ""}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(box, checkpoint_id=str(folder), no_dist=True)
    meta = json.loads(box["meta"])
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{folder} is not a Lattice checkpoint of format {FORMAT}: retrain without --resume")
    return meta


def _dense_params(trainer: Trainer) -> list[tuple[str, torch.nn.Parameter]]:
    return list(in_backward_optimizer_filter(trainer.model.named_parameters()))


def _dense_opt_state(trainer: Trainer) -> dict[str, dict[str, torch.Tensor]]:
    state = trainer.dense_opt.state
    return {name: dict(state[p]) for name, p in _dense_params(trainer) if p in state}


def _dense_opt_template(trainer: Trainer, folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    # Adam's state exists only after a first step: give DCP tensors of the right shapes to fill,
    # for the parameters that had state when saved (one that never had a gradient has none)
    saved = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    return {name: {"step": torch.zeros((), dtype=torch.float32), "exp_avg": torch.zeros_like(p),
                   "exp_avg_sq": torch.zeros_like(p)}
            for name, p in _dense_params(trainer) if f"dense_opt.{name}.exp_avg" in saved}


def _blob(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _loop_entry(trainer: Trainer) -> dict[str, Any]:
    # A string or bytes value stays one entry: DCP would flatten a nested dict into one entry per
    # leaf, and the FP8 plan's shape is only known once it is fitted
    return {"state": json.dumps(asdict(trainer.state)), "rng": torch.get_rng_state(), "fp8": _blob(trainer.fp8.state())}


def save(trainer: Trainer, root: Path | None = None) -> Path:
    """Collective: every rank calls it at the same step. `root`: default the model's checkpoint/."""
    root = root or trainer.dir / "checkpoint"
    # never overwrite the checkpoint in force: a second save at one step (an epoch ending on a
    # checkpoint_every step) goes next to it
    current = latest(root)
    folder = next(f for f in (root / f"step-{trainer.state.global_step}", root / f"step-{trainer.state.global_step}-again")
                  if f != current)
    sd: dict[str, Any] = {
        "model": trainer.model.state_dict(),
        "fused_opt": trainer.model.fused_optimizer.state_dict()["state"],
        "dense_opt": _dense_opt_state(trainer),
        "meta": json.dumps({"format": FORMAT, "world_size": trainer.world, "plan": D.plan_types(trainer.plan_json),
                            "has_best": trainer.best is not None}),
        f"loop.rank{trainer.rank}": _loop_entry(trainer),
    }
    if trainer.best is not None:
        sd["best"] = trainer.best
    if trainer.rank == 0 and folder.exists():  # left by a run that died before it was complete
        shutil.rmtree(folder)
    if trainer.world > 1:
        dist.barrier()
    dcp.save(sd, checkpoint_id=str(folder))  # returns on every rank once .metadata is written
    if trainer.rank == 0:
        tmp = root / "latest.tmp"
        tmp.write_text(folder.name)
        tmp.replace(root / "latest")
        for old in root.glob("step-*"):
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
    if trainer.world > 1:
        dist.barrier()
    return folder


def load(trainer: Trainer, folder: Path, meta: dict) -> None:
    """Fill the trainer's model, optimizers, best weights and loop state from `folder`, resharded
    to this world's plan. Collective."""
    saved_world = int(meta["world_size"])
    same_world = saved_world == trainer.world
    loop_keys = [f"loop.rank{trainer.rank}"] if same_world else [f"loop.rank{r}" for r in range(saved_world)]
    dense = _dense_opt_template(trainer, folder)
    sd: dict[str, Any] = {
        "model": trainer.model.state_dict(),
        "fused_opt": trainer.model.fused_optimizer.state_dict()["state"],
        "dense_opt": dense,
        **{k: {"state": "", "rng": torch.get_rng_state(), "fp8": b""} for k in loop_keys},
    }
    if meta.get("has_best"):
        sd["best"] = D.clone_state(trainer.model.state_dict())
    try:
        dcp.load(sd, checkpoint_id=str(folder))
    except Exception as exc:  # noqa: BLE001 - DCP raises a bare CheckpointException with per-rank causes
        raise CheckpointError(f"cannot load {folder} ({saved_world} rank(s)) into this {trainer.world}-rank "
                              f"model: {exc}. Resume with the same config and --nproc {saved_world}, or retrain "
                              "without --resume") from exc
    # dcp.load fills tensors in place (the live views above) and replaces plain objects in `sd`
    named = dict(_dense_params(trainer))
    index = {id(p): i for i, p in enumerate(p for g in trainer.dense_opt.param_groups for p in g["params"])}
    opt = trainer.dense_opt.state_dict()
    opt["state"] = {index[id(named[n])]: s for n, s in sd["dense_opt"].items()}
    trainer.dense_opt.load_state_dict(opt)
    trainer.best = sd.get("best")
    entries = [sd[k] for k in loop_keys]
    mine = entries[0] if same_world else entries[min(trainer.rank, saved_world - 1)]
    state = json.loads(mine["state"])
    if not same_world:
        # the partial epoch's loss sums are per rank and all-reduced at the epoch's end: one rank
        # carries the saved total so the epoch's mean loss is unchanged
        for key in ("epoch_loss", "epoch_examples"):
            state[key] = sum(json.loads(e["state"])[key] for e in entries) if trainer.rank == 0 else type(state[key])(0)
        state["epoch_seconds"] = max(json.loads(e["state"])["epoch_seconds"] for e in entries)
    from lattice.training.loop import TrainState

    trainer.state = TrainState(**state)
    torch.set_rng_state(mine["rng"])
    trainer.fp8.load(torch.load(io.BytesIO(mine["fp8"]), weights_only=False))
