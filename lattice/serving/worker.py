"""The app of one uvicorn worker when `lattice serve` runs several (`--workers N`, or the
scale-out profile's `serving.workers`).

uvicorn starts each worker as a fresh process that imports an app factory by name, so the
arguments travel in one environment variable. Every worker builds its own `Server`: its own
model slot watching the registry alias (a champion swap is picked up by each within
`poll_seconds`), its own online-store connection and cache, and the token read from the same
inherited environment variable.
"""

from __future__ import annotations

import json
import os

SPEC_ENV = "LATTICE_SERVE_SPEC"


def spec_env(config_file: str, workdir: str | None, poll_seconds: float, torch_threads: int,
             replay_clock: bool = False) -> dict[str, str]:
    return {SPEC_ENV: json.dumps({"config": config_file, "workdir": workdir, "poll_seconds": poll_seconds,
                                  "torch_threads": torch_threads, "replay_clock": replay_clock})}


def app():
    """uvicorn's factory (`lattice.serving.worker:app`, factory=True)."""
    import torch

    from lattice.config import load_config
    from lattice.paths import Paths
    from lattice.serving.app import create_app

    spec = json.loads(os.environ[SPEC_ENV])
    torch.set_num_threads(spec["torch_threads"])
    config = load_config(spec["config"])
    return create_app(config, Paths.for_config(config, spec["workdir"]), poll_seconds=spec["poll_seconds"],
                      replay_clock=spec.get("replay_clock", False))
