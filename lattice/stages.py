"""Every platform stage by name. A stage is a plain function `stage(config, paths, **params) -> dict`
(a JSON-able summary); the CLI, the tests and the Airflow tasks all call stages through here.
Imports are lazy so that DAG files parse fast and never pull torch or Spark."""

from __future__ import annotations

import importlib
from typing import Any, Callable

# name -> "module:function". Only stages that exist are listed.
STAGES: dict[str, str] = {
    "synth": "lattice.data.synth_stage:synth",
}


def get_stage(name: str) -> Callable[..., dict[str, Any]]:
    try:
        target = STAGES[name]
    except KeyError:
        raise KeyError(f"unknown stage {name!r}; known stages: {sorted(STAGES)}") from None
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def run_stage(name: str, config, paths, **params) -> dict[str, Any]:
    return get_stage(name)(config, paths, **params)
