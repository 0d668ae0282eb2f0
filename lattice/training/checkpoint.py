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

The Trainer saves and loads its own state (`Trainer.save_checkpoint`, `load_checkpoint`): it
hands this module its model, optimizer and plain state values, and gets plain values back, so
the checkpoint format knows nothing of the training loop.
"""

from __future__ import annotations

import io
import json
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torchrec.optim.optimizers import in_backward_optimizer_filter

from lattice.training import distributed as D

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


def dense_params(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The parameters the dense optimizer steps (the tables' fused optimizer owns the rest)."""
    return list(in_backward_optimizer_filter(model.named_parameters()))


def _dense_opt_state(model: torch.nn.Module, dense_opt: torch.optim.Optimizer) -> dict[str, dict[str, torch.Tensor]]:
    state = dense_opt.state
    return {name: dict(state[p]) for name, p in dense_params(model) if p in state}


def dense_opt_template(model: torch.nn.Module, folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    """Tensors for DCP to fill with the saved dense optimizer state, by parameter name."""
    # Adam's state exists only after a first step: give DCP tensors of the right shapes to fill,
    # for the parameters that had state when saved (one that never had a gradient has none)
    saved = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    return {name: {"step": torch.zeros((), dtype=torch.float32), "exp_avg": torch.zeros_like(p),
                   "exp_avg_sq": torch.zeros_like(p)}
            for name, p in dense_params(model) if f"dense_opt.{name}.exp_avg" in saved}


def load_dense_opt(model: torch.nn.Module, dense_opt: torch.optim.Optimizer, by_name: dict[str, dict]) -> None:
    """Put the state read by parameter name back into the optimizer (which keys it by position)."""
    named = dict(dense_params(model))
    index = {id(p): i for i, p in enumerate(p for g in dense_opt.param_groups for p in g["params"])}
    opt = dense_opt.state_dict()
    opt["state"] = {index[id(named[n])]: s for n, s in by_name.items()}
    dense_opt.load_state_dict(opt)


# the names warm_start.py reads, taking the trainer as before (duck-typed: no loop import here)
def _dense_params(trainer: Any) -> list[tuple[str, torch.nn.Parameter]]:
    return dense_params(trainer.model)


def _dense_opt_template(trainer: Any, folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    return dense_opt_template(trainer.model, folder)


def _blob(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@dataclass
class Loaded:
    """What a checkpoint gives back to the trainer besides the tensors it fills in place."""

    best: dict | None
    """The best validation's weights (None before a first validation)."""
    loop_state: dict
    """The training loop's state fields, as saved (partial sums folded on another world size)."""
    fp8_state: Any
    """The FP8 run's own state, as it handed it over."""


def save(root: Path, step: int, rank: int, world: int, plan_json: Any, *, model: torch.nn.Module,
         dense_opt: torch.optim.Optimizer, best: dict | None, loop_state: dict, fp8_state: Any) -> Path:
    """Collective: every rank calls it at the same step. `model`: the DMP model (its fused optimizer
    too); `loop_state`: the loop's plain state fields; `fp8_state`: anything torch.save takes."""
    # never overwrite the checkpoint in force: a second save at one step (an epoch ending on a
    # checkpoint_every step) goes next to it
    current = latest(root)
    folder = next(f for f in (root / f"step-{step}", root / f"step-{step}-again") if f != current)
    # A string or bytes value stays one entry: DCP would flatten a nested dict into one entry per
    # leaf, and the FP8 plan's shape is only known once it is fitted
    loop_entry = {"state": json.dumps(loop_state), "rng": torch.get_rng_state(), "fp8": _blob(fp8_state)}
    sd: dict[str, Any] = {
        "model": model.state_dict(),
        "fused_opt": model.fused_optimizer.state_dict()["state"],
        "dense_opt": _dense_opt_state(model, dense_opt),
        "meta": json.dumps({"format": FORMAT, "world_size": world, "plan": D.plan_types(plan_json),
                            "has_best": best is not None}),
        f"loop.rank{rank}": loop_entry,
    }
    if best is not None:
        sd["best"] = best
    if rank == 0 and folder.exists():  # left by a run that died before it was complete
        shutil.rmtree(folder)
    if world > 1:
        dist.barrier()
    dcp.save(sd, checkpoint_id=str(folder))  # returns on every rank once .metadata is written
    if rank == 0:
        tmp = root / "latest.tmp"
        tmp.write_text(folder.name)
        tmp.replace(root / "latest")
        for old in root.glob("step-*"):
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
    if world > 1:
        dist.barrier()
    return folder


def load(folder: Path, meta: dict, rank: int, world: int, *, model: torch.nn.Module,
         dense_opt: torch.optim.Optimizer) -> Loaded:
    """Fill `model` (and its fused optimizer) and `dense_opt` from `folder`, resharded to this
    world's plan, restore the RNG, and return the rest. Collective."""
    saved_world = int(meta["world_size"])
    same_world = saved_world == world
    loop_keys = [f"loop.rank{rank}"] if same_world else [f"loop.rank{r}" for r in range(saved_world)]
    sd: dict[str, Any] = {
        "model": model.state_dict(),
        "fused_opt": model.fused_optimizer.state_dict()["state"],
        "dense_opt": dense_opt_template(model, folder),
        **{k: {"state": "", "rng": torch.get_rng_state(), "fp8": b""} for k in loop_keys},
    }
    if meta.get("has_best"):
        sd["best"] = D.clone_state(model.state_dict())
    try:
        dcp.load(sd, checkpoint_id=str(folder))
    except Exception as exc:  # noqa: BLE001 - DCP raises a bare CheckpointException with per-rank causes
        raise CheckpointError(f"cannot load {folder} ({saved_world} rank(s)) into this {world}-rank "
                              f"model: {exc}. Resume with the same config and --nproc {saved_world}, or retrain "
                              "without --resume") from exc
    # dcp.load fills tensors in place (the live views above) and replaces plain objects in `sd`
    load_dense_opt(model, dense_opt, sd["dense_opt"])
    entries = [sd[k] for k in loop_keys]
    mine = entries[0] if same_world else entries[min(rank, saved_world - 1)]
    state = json.loads(mine["state"])
    if not same_world:
        # the partial epoch's loss sums are per rank and all-reduced at the epoch's end: one rank
        # carries the saved total so the epoch's mean loss is unchanged
        for key in ("epoch_loss", "epoch_examples"):
            state[key] = sum(json.loads(e["state"])[key] for e in entries) if rank == 0 else type(state[key])(0)
        state["epoch_seconds"] = max(json.loads(e["state"])["epoch_seconds"] for e in entries)
    torch.set_rng_state(mine["rng"])
    return Loaded(sd.get("best"), state, torch.load(io.BytesIO(mine["fp8"]), weights_only=False))
