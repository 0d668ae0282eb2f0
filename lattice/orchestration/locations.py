"""Where the orchestrated platform finds its configs and resolves relative paths.

Airflow runs tasks from whatever working directory its workers have, so relative `data_root` and
`workdir` in a config are resolved against the project root, never the current directory.
  LATTICE_PROJECT_ROOT  the project (default: the checkout holding this package)
  LATTICE_CONFIGS_DIR   the folder of platform configs the DAGs are generated from (default: <root>/configs)
  LATTICE_WORKDIR       overrides every config's workdir (tests point it at a temp folder)
"""

from __future__ import annotations

import os
from pathlib import Path

from lattice.config import PlatformConfig
from lattice.paths import Paths

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def project_root() -> Path:
    return Path(os.environ.get("LATTICE_PROJECT_ROOT") or PACKAGE_ROOT).resolve()


def configs_dir() -> Path:
    env = os.environ.get("LATTICE_CONFIGS_DIR")
    return Path(env).resolve() if env else project_root() / "configs"


def config_files(folder: Path | None = None) -> list[Path]:
    """Every platform config of a folder, in name order (one DAG family each)."""
    folder = folder or configs_dir()
    return sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")])


def paths_for(config: PlatformConfig) -> Paths:
    """`Paths.for_config`, with relative folders anchored at the project root."""
    root = project_root()
    wd = os.environ.get("LATTICE_WORKDIR") or config.workdir.format(name=config.name)
    return Paths(
        workdir=(root / Path(wd).expanduser()).resolve(),
        data_root=(root / Path(config.data_root).expanduser()).resolve(),
    )
