"""Where fitted id maps live and how training finds them."""

from __future__ import annotations

from lattice.config import PlatformConfig
from lattice.config.schema import HASHING_NEEDS_FIT
from lattice.paths import Paths


class FitMissingError(FileNotFoundError):
    """A feature's hashing needs a fitted id map that was never fitted."""


def load_fitted(config: PlatformConfig, paths: Paths) -> dict[str, dict]:
    """feature -> fitted id map for every sparse feature whose scheme needs one."""
    need = [f.name for f in config.features.sparse if f.hashing in HASHING_NEEDS_FIT]
    if not need:
        return {}
    raise FitMissingError(
        f"sparse feature(s) {need} need a fitted id map; run `lattice hashing fit CONFIG` after the features stage")
