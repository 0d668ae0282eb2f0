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
        market = config.synthetic.market if config.synthetic else None
        # logs of another market (or a static log where a market is asked for) are regenerated
        was = old.get("market") or {}
        same_market = (was.get("config"), was.get("days")) == ((market.model_dump(mode="json"), config.synthetic.days) if market else (None, None))
        if old.get("rows") == rows and old.get("seed") == (config.synthetic.seed if config.synthetic else None) and same_market:
            return {"skipped": True, **old}
    return generate(config, rows, paths.data_root, progress=progress)
