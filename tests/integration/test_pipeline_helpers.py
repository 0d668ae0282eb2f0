"""Small builders shared by the feature-pipeline integration tests (no tests here)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from lattice.config import load_config
from lattice.paths import Paths


def write_config(tmp: Path, data: dict, name: str = "cfg.yaml"):
    path = tmp / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_config(path)


def config_with(root: Path, name: str, overrides: dict, tmp: Path):
    """A shipped config with some top-level keys replaced (e.g. data_root), loaded from tmp."""
    data = yaml.safe_load((root / "configs" / f"{name}.yaml").read_text())
    data.update(overrides)
    return write_config(tmp, data, f"{name}.yaml")


def read_table(path: Path):
    import pyarrow.dataset as ds

    return ds.dataset(str(path), format="parquet", partitioning="hive").to_table().to_pandas()


def jsonl(path: Path, rows: list[dict | str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def paths_for(config, workdir: Path) -> Paths:
    return Paths.for_config(config, workdir).ensure()
