"""One way back from a saved model: `rebuild(blob)` and `load_saved(model_dir)`.

A trained model's `model.pt` (written by the trainer, `saved_blob`) holds everything needed to
rebuild it exactly: the config it was trained with, its kind and dense width, the fitted id maps
of its compressed embeddings (`hashing`), its FP8 plan (`fp8`) and its per-cell calibration maps
(`calibration`). Training, evaluation, distillation scoring, export and the gate all rebuild
through here, never from a caller's config, so a model evaluated, scored or served is the model
that was trained, calibration stage included.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lattice.config import PlatformConfig
from lattice.data.transforms import DenseStats
from lattice.models.build import build_model

META_KEYS = ("name", "plan", "cost", "best_epoch", "world_size", "fp8", "hashing", "calibration", "lineage")


@dataclass
class Saved:
    model: nn.Module
    stats: DenseStats
    config: PlatformConfig
    """The config the model was trained with (its features and domains define the inputs)."""
    blob: dict
    path: Path


def saved_blob(*, name: str, kind: str, n_dense: int, stats: DenseStats, config: dict, state_dict: dict,
               fitted: dict | None = None, fp8_plan: dict | None = None, **meta: Any) -> dict:
    """What the trainer writes to model.pt. `fitted`: feature -> fitted id map (json-able dict with
    numpy/tensor arrays) for hashing schemes that need a fit; `fp8_plan`: the dispatcher's plan."""
    return {"name": name, "kind": kind, "n_dense": int(n_dense), "dense_stats": stats.to_json(), "config": config,
            "hashing": fitted or {}, "fp8": fp8_plan, "state_dict": state_dict, **meta}


def blob_config(blob: dict) -> PlatformConfig:
    """The config a blob was trained with. A size key added after the blob was written takes the
    value its model was built with (dense_tokens: 2), not today's default."""
    from lattice.models.lattice_net import DENSE_TOKENS

    cfg = copy.deepcopy(blob["config"])
    models = cfg.get("models") or {}
    for size in (models.get("teacher"), models.get("student"), (models.get("baselines") or {}).get("size")):
        if isinstance(size, dict):
            size.setdefault("dense_tokens", DENSE_TOKENS)
    if isinstance(models.get("leaves"), dict):  # keys added since: the values its model was trained with
        models["leaves"].setdefault("margin", [])
        models["leaves"].setdefault("pooling", "sum")  # saved before models.leaves.pooling: its tokens summed
        models["leaves"].setdefault("tokens", ["teacher", "student"])  # saved before models.leaves.tokens: tokens
    return PlatformConfig.model_validate(cfg)


def rebuild(blob: dict, load_weights: bool = True, calibrated: bool = True, config: PlatformConfig | None = None) -> nn.Module:
    """The model a blob describes (weights loaded unless `load_weights` is false), eval mode. With
    calibration maps in the blob (training.calibration) it is `Calibrated(network, maps)`: its
    logits are calibrated for every consumer; `calibrated=False` gives the network alone.
    `config`: blob_config(blob), when the caller has it already."""
    config = config or blob_config(blob)
    forest = leaf_forest(blob)
    model = build_model(config, blob["kind"], int(blob["n_dense"]), fitted=blob.get("hashing") or None,
                        fp8_plan=blob.get("fp8"), leaves=forest.spec() if forest is not None else None)
    if load_weights:
        model.load_state_dict(blob["state_dict"])
    if calibrated and blob.get("calibration"):
        from lattice.models.calibrated import Calibrated, CellCalibration

        model = Calibrated(model, CellCalibration(blob["calibration"]))
    return model.eval()


def leaf_forest(blob: dict):
    """The tree fit a model reads leaf ids from (lattice.trees.leaves.LeafForest), None for most."""
    if not blob.get("leaves"):
        return None
    from lattice.trees.leaves import LeafForest

    return LeafForest.from_blob(blob["leaves"])


def read_blob(model_dir: Path) -> tuple[dict, Path]:
    path = Path(model_dir) / "model.pt"
    if not path.exists():
        name = Path(model_dir).name
        if (Path(model_dir) / "boosters").is_dir():
            # LightGBM baselines are evaluated and compared, not scored, exported or served
            raise FileNotFoundError(f"{name} is a gradient-boosted-trees baseline (LightGBM boosters in {model_dir}): it is "
                                    f"trained and evaluated for comparison only; predict, export, distill and serve take a "
                                    f"network (teacher, student or a neural baseline)")
        raise FileNotFoundError(f"no trained model at {path}; train it first (`lattice train CONFIG --model {name.split('@')[0]}`)")
    return torch.load(path, map_location="cpu", weights_only=False), path


def load_saved(model_dir: Path) -> Saved:
    blob, path = read_blob(model_dir)
    config = blob_config(blob)
    model = rebuild(blob, config=config)
    # consumers that hold only the module (scoring, serving checks) read these
    model.dense_stats = DenseStats.from_json(blob["dense_stats"])
    model.kind, model.n_dense = blob["kind"], int(blob["n_dense"])
    model.meta = {k: blob[k] for k in META_KEYS if k in blob}
    # its batches need the leaf ids of its own tree fit: RowEncoder / BatchLoader / batch_from_frame leaves=
    model.leaf_forest = leaf_forest(blob)
    if model.leaf_forest is not None:
        model.meta["leaves"] = model.leaf_forest.fit
    return Saved(model, model.dense_stats, config, blob, path)
