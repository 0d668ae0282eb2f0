"""A thin, typed wrapper over MLflow's tracking and model registry for Lattice models.

Layout: one MLflow experiment per platform config (`lattice-<config>`); one run per trained
model; registered models `<base>` (the servable students, with aliases `champion` and
`challenger`) and `<base>_<model>` for teachers and baselines. The default backend is a SQLite
file with a local artifact folder under `paths.mlflow`; `registry.tracking_uri` in the config
points at a shared tracking server instead.

The champion history (a JSON list of versions on the registered model) is what `rollback`
walks back; MLflow keeps only the current alias target.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lattice.config import PlatformConfig
from lattice.paths import Paths

log = logging.getLogger(__name__)

CHAMPION = "champion"
CHALLENGER = "challenger"
HISTORY_TAG = "lattice.champion_history"
SERVABLE = "student"


@dataclass(frozen=True)
class VersionInfo:
    name: str
    version: int
    run_id: str
    source: str
    tags: dict[str, str] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()

    @property
    def model(self) -> str:
        return self.tags.get("lattice.model", "")


def _quiet_mlflow() -> None:
    # MLflow logs alembic migrations and artifact progress bars; stage logs are ours.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


def flatten(prefix: str, value: Any, out: dict[str, str] | None = None) -> dict[str, str]:
    """Nested config dict -> {"a.b.c": "value"} for MLflow params (which are flat strings)."""
    out = {} if out is None else out
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        text = json.dumps(value, default=str) if not isinstance(value, str) else value
        out[prefix] = text[:6000]  # MLflow's param value limit
    return out


_TEMPLATE_DB: Path | None = None


def _local_backend(db: Path) -> str:
    """SQLite tracking URI for `db`, created from a per-process template: MLflow's schema
    migrations take ~15 s on a small machine, and every empty database is the same file."""
    global _TEMPLATE_DB
    if not db.exists():
        from mlflow import MlflowClient

        if _TEMPLATE_DB is None or not _TEMPLATE_DB.exists():
            folder = tempfile.mkdtemp(prefix="lattice-mlflow-")
            atexit.register(shutil.rmtree, folder, True)
            tmpl = Path(folder) / "template.db"
            MlflowClient(tracking_uri=f"sqlite:///{tmpl}").search_experiments()  # runs the migrations
            _TEMPLATE_DB = tmpl
        db.parent.mkdir(parents=True, exist_ok=True)
        part = db.with_name(db.name + f".tmp{os.getpid()}")
        shutil.copyfile(_TEMPLATE_DB, part)
        part.rename(db)
    return f"sqlite:///{db}"


class ModelRegistry:
    def __init__(self, config: PlatformConfig, paths: Paths):
        _quiet_mlflow()
        from mlflow import MlflowClient

        self.config = config
        self.paths = paths
        if config.registry.tracking_uri:
            self.tracking_uri = config.registry.tracking_uri
            self._artifact_location = None  # the server decides
        else:
            self.tracking_uri = _local_backend(paths.mlflow / "mlflow.db")
            self._artifact_location = (paths.mlflow / "artifacts").as_uri()
        self.base_name = config.registry.model_name or f"{config.name}_ranker"
        self.client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)
        self._experiment_id: str | None = None

    # ------------------------------------------------------------ names
    def registered_name(self, model: str) -> str:
        """Every student (also 'student@tag' variants) is a version of one registered model, so
        aliases compare them; teachers and baselines get their own registered models."""
        kind = model.split("@")[0].split(":")[0]
        return self.base_name if kind == SERVABLE else f"{self.base_name}_{kind}"

    @property
    def experiment_id(self) -> str:
        if self._experiment_id is None:
            name = f"lattice-{self.config.name}"
            exp = self.client.get_experiment_by_name(name)
            self._experiment_id = (
                exp.experiment_id if exp else self.client.create_experiment(name, artifact_location=self._artifact_location)
            )
        return self._experiment_id

    def _ensure_registered(self, name: str) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(name)
        except MlflowException:
            self.client.create_registered_model(name, description=f"Lattice {self.config.name}: {name}")

    # ------------------------------------------------------------ logging
    def log_model(
        self,
        model: str,
        artifact_dir: Path,
        *,
        params: dict[str, str],
        metrics: dict[str, float],
        tags: dict[str, str],
        extra_artifacts: dict[str, Path] | None = None,
        register: bool = True,
    ) -> VersionInfo | str:
        """One run with params, metrics, tags and artifacts (the model folder under `model/`,
        extras under their key); then a registered version whose source is `model/`.
        Returns the VersionInfo, or the run id when `register` is False."""
        run = self.client.create_run(self.experiment_id, run_name=model, tags={"lattice.model": model, **tags})
        rid = run.info.run_id
        try:
            from mlflow.entities import Metric, Param

            items = sorted(params.items())
            for i in range(0, len(items), 100):  # MLflow caps a batch at 100 params
                self.client.log_batch(rid, params=[Param(k[:250], v) for k, v in items[i : i + 100]])
            ms = [Metric(k, float(v), 0, 0) for k, v in sorted(metrics.items()) if v == v]  # drop NaN
            for i in range(0, len(ms), 500):
                self.client.log_batch(rid, metrics=ms[i : i + 500])
            self.client.log_artifacts(rid, str(artifact_dir), "model")
            for name, path in (extra_artifacts or {}).items():
                if Path(path).is_dir():
                    self.client.log_artifacts(rid, str(path), name)
                elif Path(path).exists():
                    self.client.log_artifact(rid, str(path), name)
            self.client.set_terminated(rid, "FINISHED")
        except Exception:
            self.client.set_terminated(rid, "FAILED")
            raise
        if not register:
            return rid
        name = self.registered_name(model)
        self._ensure_registered(name)
        source = f"{run.info.artifact_uri}/model"
        mv = self.client.create_model_version(name, source=source, run_id=rid, tags={"lattice.model": model, **tags})
        log.info("registered %s version %s (run %s)", name, mv.version, rid)
        return self.version(int(mv.version), model=model)

    def log_decision(self, version: VersionInfo, decision: dict[str, Any]) -> str:
        """A `promotion` run holding the gate decision and every reason, linked from the
        version's tags (so the registry UI shows why a version was or was not promoted)."""
        run = self.client.create_run(
            self.experiment_id, run_name=f"promotion-v{version.version}",
            tags={"lattice.model": "promotion", "lattice.challenger_version": str(version.version),
                  "lattice.decision": decision["decision"]},
        )
        rid = run.info.run_id
        with tempfile.TemporaryDirectory() as tmp:
            f = Path(tmp) / "decision.json"
            f.write_text(json.dumps(decision, indent=2, default=str))
            self.client.log_artifact(rid, str(f))
        for k, v in decision.get("measurements", {}).items():
            if isinstance(v, (int, float)) and v == v:
                self.client.log_metric(rid, k, float(v))
        self.client.set_terminated(rid, "FINISHED")
        failed = [r["message"] for r in decision["reasons"] if not r["passed"]]
        tags = {
            "lattice.gate.decision": decision["decision"],
            "lattice.gate.run_id": rid,
            "lattice.gate.failed": json.dumps(failed)[:4900],
        }
        for k, v in tags.items():
            self.client.set_model_version_tag(version.name, str(version.version), k, v)
        return rid

    # ------------------------------------------------------------ lookups
    def version(self, version: int, model: str = SERVABLE) -> VersionInfo:
        mv = self.client.get_model_version(self.registered_name(model), str(version))
        return VersionInfo(mv.name, int(mv.version), mv.run_id, mv.source, dict(mv.tags), tuple(mv.aliases))

    def by_alias(self, alias: str, model: str = SERVABLE) -> VersionInfo | None:
        from mlflow.exceptions import MlflowException

        try:
            mv = self.client.get_model_version_by_alias(self.registered_name(model), alias)
        except MlflowException:
            return None
        return VersionInfo(mv.name, int(mv.version), mv.run_id, mv.source, dict(mv.tags), tuple(mv.aliases))

    def latest(self, model: str) -> VersionInfo | None:
        from mlflow.exceptions import MlflowException

        name = self.registered_name(model)
        try:
            versions = self.client.search_model_versions(f"name='{name}'")
        except MlflowException:
            return None
        if not versions:
            return None
        mv = max(versions, key=lambda v: int(v.version))
        return self.version(int(mv.version), model=model)

    def run_metrics(self, run_id: str) -> dict[str, float]:
        return dict(self.client.get_run(run_id).data.metrics)

    def download(self, version: VersionInfo) -> Path:
        """The version's `model/` folder in a local cache (downloaded once per version)."""
        from mlflow.artifacts import download_artifacts

        dest = self.paths.mlflow / "cache" / version.name / f"v{version.version}"
        if (dest / "model").is_dir():
            return dest / "model"
        tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        got = Path(download_artifacts(artifact_uri=version.source, dst_path=str(tmp), tracking_uri=self.tracking_uri))
        if got.name != "model":
            got.rename(tmp / "model")
        try:
            tmp.rename(dest)  # atomic: a concurrent reader never sees half a download
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another process won the race
        return dest / "model"

    # ------------------------------------------------------------ aliases
    def champion_history(self) -> list[int]:
        from mlflow.exceptions import MlflowException

        try:
            rm = self.client.get_registered_model(self.base_name)
        except MlflowException:
            return []
        return [int(v) for v in json.loads(rm.tags.get(HISTORY_TAG, "[]"))]

    def set_challenger(self, version: VersionInfo) -> None:
        self.client.set_registered_model_alias(self.base_name, CHALLENGER, str(version.version))

    def promote(self, version: VersionInfo) -> int | None:
        """Move `champion` to `version` (one registry write: readers see the old or the new
        version, never neither) and append it to the history. Returns the previous champion."""
        previous = self.by_alias(CHAMPION)
        history = self.champion_history()
        if previous is not None and (not history or history[-1] != previous.version):
            history.append(previous.version)
        history.append(version.version)
        self.client.set_registered_model_alias(self.base_name, CHAMPION, str(version.version))
        self.client.set_registered_model_tag(self.base_name, HISTORY_TAG, json.dumps(history))
        cur = self.by_alias(CHALLENGER)
        if cur is not None and cur.version == version.version:
            self.client.delete_registered_model_alias(self.base_name, CHALLENGER)
        return previous.version if previous else None

    def rollback(self) -> tuple[int, int]:
        """Return `champion` to the previous champion. Returns (from_version, to_version)."""
        current = self.by_alias(CHAMPION)
        if current is None:
            raise RuntimeError(f"registered model {self.base_name!r} has no champion; nothing to roll back")
        history = self.champion_history()
        while history and history[-1] == current.version:
            history.pop()
        if not history:
            raise RuntimeError(
                f"champion v{current.version} of {self.base_name!r} has no previous champion to roll back to; "
                "promote another version instead"
            )
        target = history[-1]
        self.client.set_registered_model_alias(self.base_name, CHAMPION, str(target))
        self.client.set_registered_model_tag(self.base_name, HISTORY_TAG, json.dumps(history))
        self.client.set_model_version_tag(self.base_name, str(current.version), "lattice.rolled_back", "true")
        return current.version, target
