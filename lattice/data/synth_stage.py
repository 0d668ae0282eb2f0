"""The synth stage: raw demo logs into `paths.data_root` (skipped when they already exist)."""

from __future__ import annotations

import json

from lattice.config import PlatformConfig
from lattice.paths import Paths


def synth(config: PlatformConfig, paths: Paths, rows: int | None = None, force: bool = False, progress: bool = True) -> dict:
    from lattice.data.synth import generate

    if rows is None:  # scheduled runs pass nothing: the config decides, as everywhere else
        rows = config.synthetic.rows if config.synthetic else 200_000

    manifest = paths.data_root / "manifest.json"
    if manifest.exists() and not force:
        old = json.loads(manifest.read_text())
        if old.get("rows") == rows and old.get("seed") == (config.synthetic.seed if config.synthetic else None):
            return {"skipped": True, **old}
    return generate(config, rows, paths.data_root, progress=progress)
