"""A trained model back from its folder: `model.pt` as the trainer writes it (kind, n_dense,
dense stats, config, full unsharded state dict) -> a single-process CPU module."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from lattice.config import PlatformConfig
from lattice.data.transforms import DenseStats


@dataclass
class Trained:
    model: nn.Module
    stats: DenseStats
    config: PlatformConfig
    """The config the model was trained with (its features and domains define the inputs)."""
    blob: dict
    path: Path


def load_trained(model_dir: Path) -> Trained:
    from lattice.models import build_model

    path = Path(model_dir) / "model.pt"
    if not path.exists():
        raise FileNotFoundError(f"no trained model at {path}; train it first (`lattice train CONFIG --model {Path(model_dir).name}`)")
    blob = torch.load(path, map_location="cpu", weights_only=False)
    config = PlatformConfig.model_validate(blob["config"])
    model = build_model(config, blob["kind"], int(blob["n_dense"]))
    model.load_state_dict(blob["state_dict"])
    return Trained(model.eval(), DenseStats.from_json(blob["dense_stats"]), config, blob, path)
