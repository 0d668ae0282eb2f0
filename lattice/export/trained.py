"""A trained model back from its folder (kept for its callers): see lattice.models.saved."""

from __future__ import annotations

from pathlib import Path

from lattice.models.saved import Saved as Trained
from lattice.models.saved import load_saved

__all__ = ["Trained", "load_trained"]


def load_trained(model_dir: Path) -> Trained:
    """The trained model in `model_dir`, rebuilt from what was saved with it."""
    return load_saved(model_dir)
