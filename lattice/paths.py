"""Where every stage reads and writes, derived from the config and one work directory.

Stages take `(config, paths)`; nothing else decides file locations, so the CLI, the tests and
the Airflow tasks all agree on them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lattice.config import PlatformConfig


@dataclass(frozen=True)
class Paths:
    workdir: Path
    data_root: Path

    @classmethod
    def for_config(cls, config: PlatformConfig, workdir: str | os.PathLike | None = None) -> "Paths":
        wd = workdir or os.environ.get("LATTICE_WORKDIR") or config.workdir.format(name=config.name)
        return cls(workdir=Path(wd).resolve(), data_root=Path(config.data_root).expanduser().resolve())

    def source_path(self, path: str) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() else self.data_root / p

    # data stages
    @property
    def consolidated(self) -> Path:
        return self.workdir / "consolidated"

    @property
    def quarantine(self) -> Path:
        return self.workdir / "quarantine"

    @property
    def aggregates(self) -> Path:
        return self.workdir / "aggregates"

    def aggregate(self, name: str) -> Path:
        """One aggregate's parquet table (written by pipelines/aggregates.py, read by Feast)."""
        return self.aggregates / name

    @property
    def training_set(self) -> Path:
        return self.workdir / "training_set"

    @property
    def feast_repo(self) -> Path:
        return self.workdir / "feast"

    @property
    def validation(self) -> Path:
        return self.workdir / "validation"

    @property
    def hashing(self) -> Path:
        """Fitted id maps (`lattice hashing fit`), one `.json` + `.npz` per sparse feature."""
        # a fit belongs to the training table, not to one model run: a model staged under
        # <workdir>/.staging/<run>/ (lattice.orchestration.run_paths) reads its home's fits
        home = self.workdir.parent.parent if self.workdir.parent.name == ".staging" else self.workdir
        return home / "hashing"

    @property
    def trees(self) -> Path:
        """Fitted leaf-feature trees (`lattice trees fit`): boosters/<objective>.txt, manifest.json."""
        home = self.workdir.parent.parent if self.workdir.parent.name == ".staging" else self.workdir
        return home / "trees"

    # model stages
    @property
    def models(self) -> Path:
        return self.workdir / "models"

    def model_dir(self, model: str) -> Path:
        return self.models / model

    @property
    def teacher_scores(self) -> Path:
        return self.workdir / "teacher_scores"

    @property
    def mlflow(self) -> Path:
        return self.workdir / "mlflow"

    @property
    def reports(self) -> Path:
        return self.workdir / "reports"

    def tune_dir(self, study: str) -> Path:
        """`lattice tune`: one Optuna study (study.db, SQLite), its best overlay and best.json."""
        return self.workdir / "tune" / study

    def ensure(self) -> "Paths":
        self.workdir.mkdir(parents=True, exist_ok=True)
        return self
