"""Stage `evaluate`, and `load_model` / `predict` for every consumer of a trained model
(scoring for distillation, export, serving)."""

from __future__ import annotations

import json

import pandas as pd
import torch
from torch import nn

from lattice.config import PlatformConfig
from lattice.data.batch import Batch
from lattice.paths import Paths


def load_model(config: PlatformConfig, paths: Paths, model_name: str) -> nn.Module:
    """A single-process model on CPU with the trained weights (eval mode), rebuilt from the config
    and fitted parts saved with it (`config` only locates it). Attributes: `dense_stats` (to build
    batches), `kind`, `n_dense`, `meta` (plan, cost, best epoch, fp8 plan, hashing, calibration).
A model saved with a calibration stage outputs calibrated logits (lattice.models.calibrated)."""
    from lattice.models.saved import load_saved

    return load_saved(paths.model_dir(model_name)).model  # a missing or tree model: FileNotFoundError saying why


@torch.no_grad()
def predict(model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
    """objective -> (B,) probabilities."""
    return {o: torch.sigmoid(v) for o, v in model(batch.dense, batch.sparse, batch.domain).items()}


def load_test_predictions(paths: Paths, names: list[str]) -> dict[str, pd.DataFrame]:
    """model -> its predictions.parquet (the test split), for the models that have one."""
    out = {}
    for name in names:
        f = paths.model_dir(name) / "predictions.parquet"
        if f.exists():
            df = pd.read_parquet(f)
            out[name] = df[[c for c in df.columns if c in ("example_id", "domain") or c.split("_")[0] in ("p", "label", "mask")]]
    return out


def evaluate(config: PlatformConfig, paths: Paths, model: str | list[str]) -> dict:
    """Collect trained models' test metrics and curves into paths.reports: evaluation.json (with
    every pair's paired-bootstrap NE difference), ne_by_cell.png (per-cell NE bars incl. the
    oracle), training_curves.png."""
    from lattice.evaluation.compare import compare_models
    from lattice.evaluation.report import write_report

    names = [model] if isinstance(model, str) else list(model)
    found: dict[str, dict] = {}
    histories: dict[str, dict] = {}
    for name in names:
        d = paths.model_dir(name)
        if not (d / "metrics.json").exists():
            raise FileNotFoundError(f"model {name!r} has no metrics at {d / 'metrics.json'}; train it with "
                                    f"`lattice train CONFIG --model {name.split('@')[0]}`")
        found[name] = json.loads((d / "metrics.json").read_text())
        if (d / "history.json").exists():
            histories[name] = json.loads((d / "history.json").read_text())
    # every pair on the same test rows: is the NE difference more than resampling noise? The
    # teacher (the reference every other model is judged against) goes first: A in "B - A"
    ordered = sorted(found, key=lambda n: n != "teacher")
    comparisons = compare_models(config, load_test_predictions(paths, ordered))
    return write_report(config, paths.reports, found, histories, comparisons)
