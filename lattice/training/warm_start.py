"""Warm start (`training.warm_start`): a run continues from a parent model instead of a fresh one.

What the new run takes from its parent, and why:
  weights          the parent's shipped weights (model.pt: its best validation), every table and layer
  optimizer state  the tables' fused optimizer (row-wise Adagrad accumulators) and Adam's moments,
                   from the parent's last checkpoint when it has one; without one (an artifact
                   registered without checkpoint/) the optimizers start fresh and the run says so
  dense stats      KEPT, not refitted: the network's first layers (and the numeric encoders' bin
                   edges, lattice.models.numeric) learned on the parent's z-scores; refitting on
                   today's days would move every dense input under the learned weights at once
                   (a shift the model never trained on). Drift in the dense inputs is left to a
                   from-scratch run (warm_start: none), which refits them.
  id maps          refitted without reshuffling (lattice.hashing.refit): under `vocab` known ids keep
                   their rows and the new days' ids take the budget's free rows (the table grows;
                   its old rows are copied, the new rows and that table's optimizer state start
                   fresh); `mixed` and `learned` maps stay the parent's (frozen), and ids new since
                   the parent take their hashed out-of-map rows.
A config change the parent's weights do not fit (a table's size, a removed objective or domain, a
network size) is refused, naming the changed keys and the fix; a model that only adds parameters
(a new objective's head) is a partial warm start: the shared weights load, the new ones start fresh.
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from lattice.config import PlatformConfig
from lattice.paths import Paths



class Trainer(Protocol):
    """What a warm start loads into: the parts of `lattice.training.loop.Trainer` it writes (the
    loop imports this module, so it is described here rather than imported)."""

    model: Any  # the (sharded) model, with its fused sparse optimizer
    dense_opt: torch.optim.Optimizer
    rank: int

log = logging.getLogger(__name__)

PARENT = "parent"  # <model dir>/parent/: the previous model of a `last` warm start, moved aside
# config sections whose change can make old weights unusable (named in a refusal)
_SHAPING = ("domains", "objectives", "features", "models")
_SHAPING_TRAINING = ("label_delay", "zipper")  # Zipper heads are parameters of the model


class WarmStartError(ValueError):
    """The parent's weights cannot seed this model."""


@dataclass
class Parent:
    folder: Path  # holds model.pt (and checkpoint/ when the parent's optimizer state is known)
    mode: str  # last | champion
    checksum: str
    version: int | None = None  # registry version (champion)
    lineage: dict = field(default_factory=dict)

    @property
    def days_seen(self) -> list[str]:
        return list(self.lineage.get("days_seen", []))

    def to_json(self) -> dict:
        return {"mode": self.mode, "path": str(self.folder / "model.pt"), "version": self.version,
                "checksum": self.checksum, "days_seen": self.days_seen}


def _blob_lineage(model_pt: Path) -> dict:
    lin = Path(model_pt).parent / "lineage.json"
    if lin.exists():
        return json.loads(lin.read_text())
    blob = torch.load(model_pt, map_location="cpu", weights_only=False)
    return blob.get("lineage") or {}


def find_parent(config: PlatformConfig, paths: Paths, model: str, mode: str) -> Parent | None:
    """The parent of a warm start (None: there is none yet, the run starts from scratch). `last`:
    the model of the same name in its folder (or, after a run that failed or was interrupted,
    the one `set_aside` moved to <model dir>/parent/). `champion`: the registry's. Moves nothing."""
    from lattice.registry.checksum import sha256_path

    out = paths.model_dir(model)
    if mode == "last":
        # a DAG task, `lattice run` and the demo write the new model in a scratch folder that
        # replaces the real one when the stage succeeds (lattice.orchestration.run_paths): the last
        # model is then the real folder's, which stays whole until that swap
        home = paths.home_model_dir(model) if hasattr(paths, "home_model_dir") else out
        candidates = (out, out / PARENT) if home == out else (out, out / PARENT, home)
        folder = next((f for f in candidates if (f / "model.pt").exists()), None)
        if folder is None:
            return None
        return Parent(folder, mode, sha256_path(folder / "model.pt"), None, _blob_lineage(folder / "model.pt"))
    if mode == "champion":
        from lattice.models import kind_of
        from lattice.registry import CHAMPION, ModelRegistry
        from lattice.registry.client import SERVABLE

        reg = ModelRegistry(config, paths)
        info = reg.by_alias(CHAMPION) if kind_of(model) == SERVABLE else reg.latest(model)
        if info is None:
            return None
        folder = reg.download(info)  # verified against its manifest
        if not (folder / "model.pt").exists():
            raise WarmStartError(f"warm_start champion: registered {info.name} v{info.version} holds no model.pt "
                                 "(training weights); register the trained model folder, or use warm_start: last")
        return Parent(folder, mode, sha256_path(folder / "model.pt"), info.version, _blob_lineage(folder / "model.pt"))
    raise ValueError(f"training.warm_start {mode!r}: use none, last or champion")


def set_aside(parent: Parent, out: Path) -> Parent:
    """Move a `last` parent that still sits in the model folder to <model dir>/parent/ (the new run
    overwrites the folder; a failed run finds its parent there again). Called once every check passed."""
    if parent.folder != out:
        return parent
    aside = out / PARENT
    shutil.rmtree(aside, ignore_errors=True)
    aside.mkdir(parents=True)
    for name in ("model.pt", "lineage.json", "checkpoint"):  # (dense_stats.json is already this run's)
        if (out / name).exists():
            shutil.move(str(out / name), str(aside / name))
    parent.folder = aside
    return parent


def _flat(prefix: str, value: Any, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
        for v in value:
            _flat(f"{prefix}.{v['name']}", v, out)
    else:
        out[prefix] = value
    return out


def config_changes(old: dict, new: dict) -> list[str]:
    """Changed keys of the sections that shape a model, as `key: old -> new`."""
    def shaping(c: dict) -> dict:
        return {**{k: c.get(k) for k in _SHAPING}, "training": {k: (c.get("training") or {}).get(k) for k in _SHAPING_TRAINING}}

    a, b = _flat("", shaping(old), {}), _flat("", shaping(new), {})
    return [f"{k}: {a.get(k, '(absent)')!r} -> {b.get(k, '(absent)')!r}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and not k.endswith(("description", "min_rows", "label_rate", "loss_weight"))]


def grown_tables(parent_maps: dict, maps: dict) -> set[str]:
    """Features whose refitted map needs more table rows than the parent's (vocab growth)."""
    return {f for f, by in maps.items() for r, m in by.items()
            if int(m["table_rows"]) > int(((parent_maps.get(f) or {}).get(r) or {}).get("table_rows", m["table_rows"]))}


def _is_grown(key: str, grown: set[str]) -> bool:
    return any(key.endswith(f".t_{f}.weight") for f in grown)


def check_compatible(model: torch.nn.Module, blob: dict, config: PlatformConfig, kind: str,
                     grown: set[str] = frozenset()) -> list[str]:
    """Raise WarmStartError when the parent's weights do not fit `model` (the plain model, before
    sharding); return the names of parameters the parent lacks (a partial warm start). A table of
    a feature in `grown` (its refitted vocab gained rows) may be longer than the parent's."""
    if blob.get("kind") != kind:
        raise WarmStartError(f"warm start: the parent is a {blob.get('kind')!r} model, this run trains a {kind!r}; "
                             "warm-start from a model of the same kind (or training.warm_start: none)")
    if getattr(model, "leaves", None) is not None:  # same tables, other tokens: the shapes cannot tell
        from lattice.models.saved import blob_config

        was, now = blob_config(blob).models.leaves.pooling[kind], config.models.leaves.pooling[kind]
        if was != now:
            raise WarmStartError(f"warm start refused: the parent {kind} pooled its leaf tokens by {was!r}, this config by "
                                 f"{now!r} (models.leaves.pooling.{kind}). Fix: set models.leaves.pooling.{kind}: {was} to "
                                 "warm-start, or train from scratch with training.warm_start: none")
    mine, theirs = model.state_dict(), blob["state_dict"]
    def fits(k: str, new: torch.Tensor) -> bool:
        old = tuple(theirs[k].shape)
        if old == tuple(new.shape):
            return True
        return _is_grown(k, grown) and old[1:] == tuple(new.shape[1:]) and old[0] <= new.shape[0]

    shapes = [f"{k}: {tuple(theirs[k].shape)} -> {tuple(v.shape)}" for k, v in mine.items()
              if k in theirs and not fits(k, v)]
    removed = sorted(set(theirs) - set(mine))
    if shapes or removed:
        changes = config_changes(blob.get("config") or {}, config.model_dump(mode="json"))
        what = "; ".join(changes[:8]) or "no config key differs: the model code changed"
        detail = "; ".join(shapes[:4] + [f"{k} is gone" for k in removed[:4]])
        raise WarmStartError(
            f"warm start refused: the parent's weights do not fit this {kind} ({detail}). What changed in the "
            f"config: {what}. Fix: restore those keys to warm-start, or train from scratch with "
            "training.warm_start: none (or --set training.warm_start=none)")
    return sorted(set(mine) - set(theirs))


def _copy_full(live: dict[str, Any], full: dict[str, torch.Tensor]) -> None:
    """Copy unsharded tensors into a (possibly sharded) live state dict, each rank its own shards."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    def put(dst: torch.Tensor, src: torch.Tensor, offs: list[int]) -> None:
        # the part of `src` (a grown table's parent: fewer rows) inside this region; the rest keeps its init
        region = tuple(slice(max(0, min(o, n)), max(0, min(o + s, n))) for o, s, n in zip(offs, dst.shape, src.shape))
        local = tuple(slice(r.start - o, r.stop - o) for r, o in zip(region, offs))
        dst.detach()[local].copy_(src[region].to(dst.device))

    for k, v in live.items():
        if k not in full:
            continue
        src = full[k]
        if isinstance(v, ShardedTensor):
            for shard in v.local_shards():
                put(shard.tensor, src, list(shard.metadata.shard_offsets))
        elif isinstance(v, torch.Tensor):
            put(v, src, [0] * v.dim())


def load(trainer: Trainer, parent: Path, grown: set[str] = frozenset()) -> dict:
    """Fill the trainer's model with the parent's weights and, when the parent's checkpoint holds
    them, its optimizer states. Collective (every rank calls it). Returns what was taken."""
    import torch.distributed.checkpoint as dcp

    from lattice.training import checkpoint

    blob = torch.load(Path(parent) / "model.pt", map_location="cpu", weights_only=False)
    _copy_full(trainer.model.state_dict(), blob["state_dict"])
    taken = {"weights": True, "optimizer": False}
    folder = checkpoint.latest(Path(parent) / "checkpoint")
    if folder is None:
        if trainer.rank == 0:
            print("[lattice] warm start: the parent has no checkpoint/, so the optimizers start fresh "
                  "(weights, dense stats and id maps are the parent's)", flush=True)
        return taken
    saved = set(dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata)
    fused = trainer.model.fused_optimizer.state_dict()["state"]
    # a grown table's optimizer state (one accumulator per row) starts fresh with its new rows
    fused = {t: s for t, s in fused.items() if any(k.startswith(f"fused_opt.{t}.") for k in saved) and not _is_grown(t, grown)}
    dense = {n: s for n, s in checkpoint._dense_opt_template(trainer, folder).items() if not _is_grown(n, grown)}
    sd = {"fused_opt": fused, "dense_opt": dense}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(sd, checkpoint_id=str(folder))
    named = dict(checkpoint._dense_params(trainer))
    index = {id(p): i for i, p in enumerate(p for g in trainer.dense_opt.param_groups for p in g["params"])}
    opt = trainer.dense_opt.state_dict()
    opt["state"] = {index[id(named[n])]: s for n, s in sd["dense_opt"].items()}
    trainer.dense_opt.load_state_dict(opt)
    taken["optimizer"] = True
    if grown:
        taken["fresh_optimizer_tables"] = sorted(grown)
    return taken
