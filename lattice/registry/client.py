"""A thin, typed wrapper over MLflow's tracking and model registry for Lattice models.

Layout: one MLflow experiment per platform config (`lattice-<config>`); one run per trained
model; registered models `<base>` (the servable students, with aliases `champion` and
`challenger`) and `<base>_<model>` for teachers and baselines. The default backend is a SQLite
file with a local artifact folder under `paths.mlflow`; `registry.tracking_uri` in the config
points at a shared tracking server instead (in the scale-out profile, when it is unset, the
profile's tracking server: `lattice.deploy.profile.services`).

The champion history (a JSON list of versions on the registered model) is what `rollback`
walks back; MLflow keeps only the current alias target.

Integrity: at registration every file of the model folder is hashed (a manifest, logged next to
`model/` as `manifest.json`, its digest a tag on the run and the version), and the stored copy is
downloaded back and checked before the version exists. The download cache is keyed by that
digest (and the run) and re-verified on every use; a changed file is a miss (downloaded again),
and a stored copy that does not match is an `ArtifactIntegrityError` naming the files.

Locked or unreadable is never absent: every client call retries a locked SQLite database for a
bounded time (`lattice.registry.patience`), then fails naming the file and its holders; only
MLflow's "not found" reads as no model or no alias; a 0-byte or garbage database is an error.

Promotion and rollback are all-or-nothing: the decision run is written (pending) before the
alias moves, and a failure after the move puts the alias, the history and the tags back.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from lattice.config import PlatformConfig
from lattice.paths import Paths
from lattice.registry.checksum import (MANIFEST_FILE, MANIFEST_TAG, ArtifactIntegrityError, compare, manifest, manifest_digest,
                                       read_manifest, sha256_path, write_manifest)
from lattice.registry.patience import LOCK_WAIT_S, PatientClient, RegistryUnavailableError, check_sqlite_file

log = logging.getLogger(__name__)

CHAMPION = "champion"
CHALLENGER = "challenger"
HISTORY_TAG = "lattice.champion_history"
SERVABLE = "student"
"""sha256 of the registered folder's manifest (run and version tag): its content key."""
PROMOTION_STATUS_TAG = "lattice.promotion.status"
"""On a promotion's decision run: pending (alias not yet moved) -> done, or rolled_back."""
INTENT_TAG = "lattice.promotion.intent"
"""On the registered model while a promotion or rollback is under way: what it moves from and to,
so that the next one completes or undoes it after a crash (see `ModelRegistry.reconcile`)."""
MOVE_LOCK_FILE = "promotion.lock"
MOVE_LOCK_WAIT_S = 60.0
GATE_TAGS = ("lattice.gate.decision", "lattice.gate.run_id", "lattice.gate.failed")
REGISTRY_MARKER = "registry.json"
"""Written beside mlflow.db when the local registry is created: once it exists, a missing
database is an error, never a new empty registry."""


class RegistryMissingError(FileNotFoundError):
    """The work directory had a registry, and its database is gone."""


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
    # it logs a traceback for each locked statement that it also raises: PatientClient retries
    # those and reports the lock once, naming the file
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


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


def _registry_evidence(folder: Path) -> str | None:
    """What shows that `folder` (paths.mlflow) held a registry: its marker, stored artifacts or
    a download cache. None for a work directory that never had one."""
    if (folder / REGISTRY_MARKER).is_file():
        return f"{folder / REGISTRY_MARKER}"
    for sub in ("artifacts", "cache"):
        if (folder / sub).is_dir() and any((folder / sub).iterdir()):
            return f"{folder / sub} (not empty)"
    return None


def check_local_registry(folder: Path) -> None:
    """Raise RegistryMissingError when the work directory had a registry whose database is gone
    (creates nothing: stages call it before their long work)."""
    db = folder / "mlflow.db"
    if not db.exists():
        evidence = _registry_evidence(folder)
        if evidence is not None:
            raise RegistryMissingError(
                f"the model registry database {db} is missing, but this work directory had a registry (see {evidence}). "
                f"Restore {db} from a backup, or set `registry.tracking_uri` to where the registry now lives. A new "
                f"empty registry would restart versions at 1 beside the old artifacts, so none is created; to start "
                f"afresh on purpose, move {folder} away first."
            )


def _open_local_registry(folder: Path) -> str:
    """The SQLite tracking URI of the work directory's registry. Only a work directory that
    never had a registry gets a new one; a missing database of an existing one is an error."""
    db = folder / "mlflow.db"
    check_local_registry(folder)
    check_sqlite_file(db)  # a 0-byte or garbage file is an error, never a new empty registry
    uri = _local_backend(db)
    marker = folder / REGISTRY_MARKER
    if not marker.exists():
        part = marker.with_name(marker.name + f".tmp{os.getpid()}")
        part.write_text(json.dumps({"database": str(db), "created_or_first_seen": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
        part.replace(marker)
    return uri


def _file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode): what changes when a file is replaced rather than written in place."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _profile_tracking_uri(config: PlatformConfig) -> str | None:
    if config.deployment.profile == "embedded":
        return None
    from lattice.deploy.profile import services

    return services(config).mlflow_tracking_uri


def _not_found(exc: Exception) -> bool:
    """MLflow's "no such model / alias" (what may be read as absent), as opposed to a locked,
    unreadable or unreachable registry (which must never be)."""
    code = getattr(exc, "error_code", "")
    return code == "RESOURCE_DOES_NOT_EXIST" or (code == "INVALID_PARAMETER_VALUE" and "not found" in str(exc))


class ModelRegistry:
    def __init__(self, config: PlatformConfig, paths: Paths, lock_wait_s: float = LOCK_WAIT_S):
        _quiet_mlflow()
        from mlflow import MlflowClient

        self.config = config
        self.paths = paths
        # an explicit registry.tracking_uri wins; else the scale-out profile's tracking server
        # (its artifact store too: the server proxies artifacts); else the work directory's SQLite
        server = config.registry.tracking_uri or _profile_tracking_uri(config)
        if server:
            self.tracking_uri = server
            self._artifact_location = None  # the server decides
            self.database: Path | None = None
        else:
            self.tracking_uri = _open_local_registry(paths.mlflow)
            self._artifact_location = (paths.mlflow / "artifacts").as_uri()
            self.database = paths.mlflow / "mlflow.db"
        self.base_name = config.registry.model_name or f"{config.name}_ranker"
        # a domain/objective subset run (lattice.orchestration.run_paths) registers its models
        # under names of their own: never the full teacher's latest version, never the servable
        # model's challenger
        self.variant: str | None = getattr(paths, "variant", None)
        # every call retries a locked database for a bounded time, then names the file
        self.client = PatientClient(MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri),
                                    self.database, lock_wait_s)
        self._experiment_id: str | None = None
        self._db_identity = _file_identity(self.database) if self.database is not None else None
        self.move_lock_wait_s = MOVE_LOCK_WAIT_S
        self.last_reconciled: str | None = None

    def watch_database(self) -> bool:
        """For a long-lived reader (the server's watcher): raise when the local database is gone
        or no longer SQLite, and reopen it when the file was replaced (deleted and restored from a
        backup, or renamed over). MLflow keeps one pooled engine per URI whose connections hold
        the file they opened, so without this a server would keep reading a deleted registry.
        True when it reopened. A tracking server: nothing to watch."""
        if self.database is None:
            return False
        if not self.database.exists():
            check_local_registry(self.paths.mlflow)  # names the backup to restore
            raise RegistryMissingError(f"the model registry database {self.database} is missing; restore it from a backup")
        check_sqlite_file(self.database)
        identity = _file_identity(self.database)
        if identity == self._db_identity:
            return False
        from lattice.registry.patience import dispose_engines

        dispose_engines(self.client._client)  # the next statement opens the file now at the path
        log.warning("the model registry database %s was replaced (inode %s -> %s); reopened it", self.database,
                    self._db_identity[1] if self._db_identity else None, identity[1] if identity else None)
        self._db_identity = identity
        return True

    # ------------------------------------------------------------ names
    def registered_name(self, model: str) -> str:
        """Every student (also 'student@tag' variants) is a version of one registered model, so
        aliases compare them; teachers and baselines get their own registered models."""
        kind = model.split("@")[0].split(":")[0]
        name = self.base_name if kind == SERVABLE else f"{self.base_name}_{kind}"
        return name if self.variant is None else f"{name}__{self.variant}"

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
        except MlflowException as exc:
            if not _not_found(exc):
                raise
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
        Returns the VersionInfo, or the run id when `register` is False.

        `model/` also gets an MLflow pyfunc flavour (lattice.registry.pyfunc), so
        `mlflow.pyfunc.load_model("models:/<name>@champion")` scores raw rows.

        Every file of `model/` is hashed first (the manifest, logged as `manifest.json`
        beside `model/`); the stored copy is downloaded back and verified before the run is
        finished, so a version only ever names bytes that match its manifest."""
        files = manifest(artifact_dir)
        if not files:
            raise FileNotFoundError(f"nothing to register: {artifact_dir} has no files")
        with tempfile.TemporaryDirectory() as tmp:
            flavour = self._pyfunc_flavour(model, Path(tmp) / "pyfunc", files, artifact_dir)
            files = {**files, **manifest(flavour)}
            return self._log_model(model, artifact_dir, flavour, files, params=params, metrics=metrics, tags=tags,
                                   extra_artifacts=extra_artifacts, register=register)

    def _pyfunc_flavour(self, model: str, dest: Path, files: dict[str, str], artifact_dir: Path) -> Path:
        """The MLflow pyfunc files for `model/` (lattice.registry.pyfunc), written to `dest`; they
        are logged into `model/` beside the model's own files, so none may share a name with one."""
        from lattice.registry.pyfunc import save_flavour

        flavour = save_flavour(dest, model, self.paths.workdir)
        clash = sorted(set(files) & set(manifest(flavour)))
        if clash:
            raise ValueError(f"{artifact_dir} has files named like MLflow's pyfunc files {clash}; rename them "
                             "(the registered folder holds both)")
        return flavour

    def _log_model(self, model: str, artifact_dir: Path, flavour: Path, files: dict[str, str], *, params: dict[str, str],
                   metrics: dict[str, float], tags: dict[str, str], extra_artifacts: dict[str, Path] | None,
                   register: bool) -> VersionInfo | str:
        digest = manifest_digest(files)
        tags = {**tags, MANIFEST_TAG: digest}
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
            self.client.log_artifacts(rid, str(flavour), "model")  # merged into model/: the pyfunc flavour
            with tempfile.TemporaryDirectory() as tmp:
                self.client.log_artifact(rid, str(write_manifest(files, Path(tmp) / MANIFEST_FILE)))
            for name, path in (extra_artifacts or {}).items():
                if Path(path).is_dir():
                    self.client.log_artifacts(rid, str(path), name)
                elif Path(path).exists():
                    self.client.log_artifact(rid, str(path), name)
            # verified when registered: what the store holds is what was hashed (and now cached)
            self._fetch(digest, f"{run.info.artifact_uri}/model", rid, f"{model} (run {rid}) as stored")
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
        version's tags (so the registry UI shows why a version was or was not promoted).
        For a decision that moves the alias, use `record_promotion` (one step with the move)."""
        rid = self._open_decision(version, decision)
        self._close_decision(rid, version, decision)
        return rid

    def _open_decision(self, version: VersionInfo, decision: dict[str, Any], status: str | None = None) -> str:
        """The decision run with its full record (decision.json, metrics), still RUNNING."""
        tags = {"lattice.model": "promotion", "lattice.challenger_version": str(version.version),
                "lattice.decision": decision["decision"]}
        if status is not None:
            tags[PROMOTION_STATUS_TAG] = status
        run = self.client.create_run(self.experiment_id, run_name=f"promotion-v{version.version}", tags=tags)
        rid = run.info.run_id
        try:
            with tempfile.TemporaryDirectory() as tmp:
                f = Path(tmp) / "decision.json"
                f.write_text(json.dumps(decision, indent=2, default=str))
                self.client.log_artifact(rid, str(f))
            for k, v in decision.get("measurements", {}).items():
                if isinstance(v, (int, float)) and v == v:
                    self.client.log_metric(rid, k, float(v))
            for k, (v, step) in decision.get("series", {}).items():  # next-day cells: step = day index
                self.client.log_metric(rid, k, float(v), step=int(step))
        except Exception:
            try:
                self.client.set_terminated(rid, "FAILED")
            except Exception:  # the registry is unreachable: the run stays RUNNING (no alias moved)
                log.warning("could not mark the incomplete decision run %s as failed", rid)
            raise
        return rid

    def _close_decision(self, rid: str, version: VersionInfo, decision: dict[str, Any], status: str | None = None) -> None:
        """Link the decision from the version's tags and finish the run."""
        failed = [r["message"] for r in decision["reasons"] if not r["passed"]]
        tags = {
            "lattice.gate.decision": decision["decision"],
            "lattice.gate.run_id": rid,
            "lattice.gate.failed": json.dumps(failed)[:4900],
        }
        for k, v in tags.items():
            self.client.set_model_version_tag(version.name, str(version.version), k, v)
        if status is not None:
            self.client.set_tag(rid, PROMOTION_STATUS_TAG, status)
        self.client.set_terminated(rid, "FINISHED")

    # ------------------------------------------------------------ lookups
    def version(self, version: int, model: str = SERVABLE) -> VersionInfo:
        mv = self.client.get_model_version(self.registered_name(model), str(version))
        return VersionInfo(mv.name, int(mv.version), mv.run_id, mv.source, dict(mv.tags), tuple(mv.aliases))

    def by_alias(self, alias: str, model: str = SERVABLE) -> VersionInfo | None:
        from mlflow.exceptions import MlflowException

        try:
            mv = self.client.get_model_version_by_alias(self.registered_name(model), alias)
        except MlflowException as exc:
            if _not_found(exc):  # no such model or alias; a locked or unreadable registry raises
                return None
            raise
        return VersionInfo(mv.name, int(mv.version), mv.run_id, mv.source, dict(mv.tags), tuple(mv.aliases))

    def latest(self, model: str) -> VersionInfo | None:
        from mlflow.exceptions import MlflowException

        name = self.registered_name(model)
        try:
            versions = self.client.search_model_versions(f"name='{name}'")
        except MlflowException as exc:
            if _not_found(exc):
                return None
            raise
        if not versions:
            return None
        mv = max(versions, key=lambda v: int(v.version))
        return self.version(int(mv.version), model=model)

    def run_metrics(self, run_id: str) -> dict[str, float]:
        return dict(self.client.get_run(run_id).data.metrics)

    def download(self, version: VersionInfo) -> Path:
        """The version's `model/` folder from the local cache, verified file by file against the
        manifest recorded at registration (on every call: a cache entry is never trusted as is).
        Raises ArtifactIntegrityError, naming the files, when the stored copy does not match."""
        what = f"{version.name} v{version.version}"
        digest = version.tags.get(MANIFEST_TAG)
        if digest:
            return self._fetch(digest, version.source, version.run_id, what)
        return self._fetch_unmanifested(version, what)

    def verify_stored(self, version: VersionInfo) -> None:
        """Check the version's copy in the artifact store (what every other replica downloads),
        not this machine's cache, file by file against its registration: downloaded afresh into
        a scratch folder that is then removed. Raises ArtifactIntegrityError naming each file."""
        what = f"{version.name} v{version.version} as stored at {version.source}"
        digest = version.tags.get(MANIFEST_TAG)
        with tempfile.TemporaryDirectory(prefix="lattice-verify-") as tmp:
            tmp = Path(tmp)
            got = self._download_to(tmp, artifact_uri=version.source)
            folder = got if got.is_dir() else tmp
            if digest:
                self._download_to(tmp / "record", run_id=version.run_id, artifact_path=MANIFEST_FILE)
                expected = read_manifest(tmp / "record" / MANIFEST_FILE, digest)
                bad = compare(expected, manifest(folder))
            else:
                checksum = version.tags.get("lattice.checksum")
                if not checksum:
                    raise ArtifactIntegrityError(what, ["no manifest and no checksum were recorded at registration"])
                sub = folder / "export" if version.tags.get("lattice.exported") == "true" else folder
                try:
                    now = sha256_path(sub)
                except FileNotFoundError:
                    now = "missing"
                bad = [] if now == checksum else [f"{sub.relative_to(folder).as_posix() or 'model'}/: sha256 {now[:16]}… "
                                                  f"differs from the registered {checksum[:16]}…"]
        if bad:
            raise ArtifactIntegrityError(what, bad)

    @property
    def _cache(self) -> Path:
        return self.paths.mlflow / "cache"

    def _fetch(self, digest: str, source: str, run_id: str, what: str) -> Path:
        """Cache entry `<run id>-sha256-<digest>/` (`model/` and its `manifest.json`): keyed by the
        content and by the run whose stored copy it is, so each version's own copy (the one every
        other server downloads) is what gets verified, and a new registry's run never hits an old entry."""

        def problems(entry: Path) -> list[str]:
            expected = read_manifest(entry / MANIFEST_FILE, digest)
            return compare(expected, manifest(entry / "model"))

        def extra(tmp: Path) -> None:
            self._download_to(tmp, run_id=run_id, artifact_path=MANIFEST_FILE)

        return self._cached(self._cache / f"{run_id}-sha256-{digest}", source, what, problems, extra)

    def _fetch_unmanifested(self, version: VersionInfo, what: str) -> Path:
        """A version registered before manifests: checked against its recorded folder checksum
        (`lattice.checksum`, of `export/` when it was exported), cached per run."""
        checksum = version.tags.get("lattice.checksum")
        if not checksum:
            raise ArtifactIntegrityError(what, ["no manifest and no checksum were recorded at registration; register the model again"])
        sub = "export" if version.tags.get("lattice.exported") == "true" else ""

        def problems(entry: Path) -> list[str]:
            folder = entry / "model" / sub if sub else entry / "model"
            try:
                got = sha256_path(folder)
            except FileNotFoundError:
                return [f"{sub or 'model'}/: missing or empty"]
            return [] if got == checksum else [f"{sub or 'model'}/: sha256 {got[:16]}… differs from the registered {checksum[:16]}…"]

        return self._cached(self._cache / f"{version.run_id}-legacy-{checksum}", version.source, what, problems, None)

    def _cached(self, entry: Path, source: str, what: str, problems: Callable[[Path], list[str]],
                extra: Callable[[Path], None] | None) -> Path:
        def check(folder: Path) -> list[str]:
            try:
                return problems(folder) if (folder / "model").is_dir() else ["model/: missing"]
            except ArtifactIntegrityError as exc:
                return exc.problems

        if entry.exists():
            bad = check(entry)
            if not bad:
                return entry / "model"
            log.warning("the cached copy of %s at %s does not match its registration (%s); downloading it again",
                        what, entry, "; ".join(bad[:5]))
            self._discard(entry)
        tmp = entry.with_name(entry.name + f".tmp{os.getpid()}-{threading.get_ident()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            got = self._download_to(tmp, artifact_uri=source)
            if got.name != "model":
                got.rename(tmp / "model")
            if extra is not None:
                extra(tmp)
            bad = check(tmp)
            if bad:
                raise ArtifactIntegrityError(f"{what} (stored at {source})", bad)
            try:
                tmp.rename(entry)  # atomic: a concurrent reader never sees half a download
            except OSError:  # another process won the race
                if check(entry):  # ... and it does not verify: ours replaces it
                    self._discard(entry)
                    try:
                        tmp.rename(entry)
                    except OSError:
                        raise ArtifactIntegrityError(what, [f"{entry}: replaced concurrently by a copy that does not verify"]) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return entry / "model"

    def _download_to(self, dst: Path, **where: str) -> Path:
        from mlflow.artifacts import download_artifacts

        return Path(download_artifacts(dst_path=str(dst), tracking_uri=self.tracking_uri, **where))

    @staticmethod
    def _discard(entry: Path) -> None:
        aside = entry.with_name(entry.name + f".bad{os.getpid()}-{threading.get_ident()}")
        try:
            entry.rename(aside)
        except OSError:
            return  # already discarded (or replaced) by another process
        shutil.rmtree(aside, ignore_errors=True)

    # ------------------------------------------------------------ aliases
    def champion_history(self) -> list[int]:
        from mlflow.exceptions import MlflowException

        try:
            rm = self.client.get_registered_model(self.base_name)
        except MlflowException as exc:
            if _not_found(exc):
                return []
            raise
        return [int(v) for v in json.loads(rm.tags.get(HISTORY_TAG, "[]"))]

    def set_challenger(self, version: VersionInfo) -> None:
        self.client.set_registered_model_alias(self.base_name, CHALLENGER, str(version.version))

    def promote(self, version: VersionInfo, verify_stored: bool = True) -> int | None:
        """Move `champion` to `version` (one alias write: readers see the old or the new version,
        never neither) and append it to the history, as one step: a failure after the alias
        moved puts the alias and the history back. Returns the previous champion.
        The stored copy is verified first (`verify_stored`); False forces the move (tests that
        need a champion the gate would refuse)."""
        return self._promote(version, None, verify_stored)[0]

    def record_promotion(self, version: VersionInfo, decision: dict[str, Any], verify_stored: bool = True) -> str:
        """The gate's passing decision and the move, all or nothing: the decision run is written
        first (status pending), then the alias and the history move, then the decision is linked
        from the version and marked done. Any failure after the alias moved restores the previous
        champion (or no champion), the history, the challenger alias and the version's gate tags,
        marks the run rolled_back, and re-raises. Returns the decision run id. `verify_stored`
        (default on) checks the stored copy first, as `promote` does."""
        return self._promote(version, decision, verify_stored)[1]

    def _promote(self, version: VersionInfo, decision: dict[str, Any] | None,
                 verify_stored: bool = True) -> tuple[int | None, str | None]:
        with self.move_lock(f"promotion of v{version.version}"):
            self.reconcile()
            return self._promote_locked(version, decision, verify_stored)

    def _promote_locked(self, version: VersionInfo, decision: dict[str, Any] | None,
                        verify_stored: bool) -> tuple[int | None, str | None]:
        from mlflow.exceptions import MlflowException

        name, v = self.base_name, str(version.version)
        previous = self.by_alias(CHAMPION)
        if decision is not None and "champion_before" in decision:
            was = previous.version if previous else None
            if was != decision["champion_before"]:  # another promote or rollback moved it during the gate
                raise RuntimeError(f"the champion changed from {decision['champion_before']} to {was} while challenger "
                                   f"v{v} was gated; run `lattice promote` again to gate it against the new champion")
        if verify_stored:  # every replica downloads the stored copy: it, not the local cache, must match
            self.verify_stored(version)
        try:
            old_history = self.client.get_registered_model(name).tags.get(HISTORY_TAG)
        except MlflowException as exc:
            if not _not_found(exc):
                raise
            old_history = None
        history = [int(x) for x in json.loads(old_history or "[]")]
        if previous is not None and (not history or history[-1] != previous.version):
            history.append(previous.version)
        history.append(version.version)
        challenger = self.by_alias(CHALLENGER)
        rid = self._open_decision(version, decision, status="pending") if decision is not None else None
        intent = {"kind": "promotion", "target": version.version, "previous": previous.version if previous else None,
                  "history_before": old_history, "history_after": history, "run_id": rid,
                  "clear_challenger": challenger is not None and challenger.version == version.version,
                  "gate_tags": self._gate_tags(rid, decision) if rid is not None else None}

        steps: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = []
        steps.append(("intent record", lambda: self._write_intent(intent), lambda: self._clear_intent()))
        if rid is not None:
            steps.append(("decision run", lambda: None, lambda: self._abandon(rid)))
        steps.append(("champion alias", lambda: self.client.set_registered_model_alias(name, CHAMPION, v),
                      lambda: self._set_alias(CHAMPION, previous.version if previous else None)))
        steps.append(("champion history", lambda: self.client.set_registered_model_tag(name, HISTORY_TAG, json.dumps(history)),
                      lambda: self._restore_model_tag(HISTORY_TAG, old_history)))
        if intent["clear_challenger"]:
            steps.append(("challenger alias", lambda: self.client.delete_registered_model_alias(name, CHALLENGER),
                          lambda: self._set_alias(CHALLENGER, version.version)))
        if rid is not None:
            now = self.client.get_model_version(version.name, v).tags  # fresh: a dry run may have tagged it since
            before = {k: now.get(k) for k in GATE_TAGS}
            steps.append(("decision record", lambda: self._finish_decision(rid, version.version, intent["gate_tags"]),
                          lambda: self._restore_version_tags(version, before)))
        steps.append(("intent done", lambda: self._clear_intent(), lambda: None))
        self._all_or_nothing(f"promotion of v{v} to {CHAMPION}", steps)
        log.info("promoted %s v%s to %s (was %s)", name, v, CHAMPION, f"v{previous.version}" if previous else "none")
        return (previous.version if previous else None), rid

    def rollback(self) -> tuple[int, int]:
        """Return `champion` to the previous champion, as one step (a failure after the alias
        moved puts it back). Returns (from_version, to_version)."""
        with self.move_lock("rollback"):
            self.reconcile()
            return self._rollback_locked()

    def _rollback_locked(self) -> tuple[int, int]:
        current = self.by_alias(CHAMPION)
        if current is None:
            raise RuntimeError(f"registered model {self.base_name!r} has no champion; nothing to roll back")
        name = self.base_name
        old_history = self.client.get_registered_model(name).tags.get(HISTORY_TAG)
        history = self.champion_history()
        while history and history[-1] == current.version:
            history.pop()
        if not history:
            raise RuntimeError(
                f"champion v{current.version} of {self.base_name!r} has no previous champion to roll back to; "
                "promote another version instead"
            )
        target = history[-1]
        try:  # a replica that follows the alias downloads the stored copy: refuse a target that fails
            self.verify_stored(self.version(target))
        except ArtifactIntegrityError as exc:
            raise ArtifactIntegrityError(f"rollback target {exc.what} (the champion stays v{current.version}; "
                                         f"promote a verified version instead)", exc.problems) from None
        before = {"lattice.rolled_back": current.tags.get("lattice.rolled_back")}
        intent = {"kind": "rollback", "target": target, "previous": current.version, "history_before": old_history,
                  "history_after": history, "run_id": None}
        self._all_or_nothing(f"rollback of {CHAMPION} from v{current.version} to v{target}", [
            ("intent record", lambda: self._write_intent(intent), lambda: self._clear_intent()),
            ("champion alias", lambda: self.client.set_registered_model_alias(name, CHAMPION, str(target)),
             lambda: self._set_alias(CHAMPION, current.version)),
            ("champion history", lambda: self.client.set_registered_model_tag(name, HISTORY_TAG, json.dumps(history)),
             lambda: self._restore_model_tag(HISTORY_TAG, old_history)),
            ("rolled_back tag", lambda: self.client.set_model_version_tag(name, str(current.version), "lattice.rolled_back", "true"),
             lambda: self._restore_version_tags(current, before)),
            ("intent done", lambda: self._clear_intent(), lambda: None),
        ])
        return current.version, target

    # ------------------------------------------------------------ crash safety
    @contextmanager
    def move_lock(self, what: str) -> Iterator[None]:
        """One promote or rollback at a time on this registry: a file lock beside it (released by
        the kernel when its holder dies, so a crash leaves no stale lock). A second one waits up
        to `move_lock_wait_s`, then reports who holds it."""
        import fcntl

        self.paths.mlflow.mkdir(parents=True, exist_ok=True)
        path = self.paths.mlflow / MOVE_LOCK_FILE
        with path.open("a+") as fh:
            deadline = time.monotonic() + self.move_lock_wait_s
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        fh.seek(0)
                        holder = fh.read().strip() or "unknown"
                        raise RuntimeError(f"{what}: another promote or rollback holds {path} ({holder}); waited "
                                           f"{self.move_lock_wait_s:.0f} s. Run it again once that one has finished.") from None
                    time.sleep(0.2)
            try:
                fh.seek(0)
                fh.truncate()
                fh.write(f"pid {os.getpid()}, {what}, since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")
                fh.flush()
                yield
            finally:
                fh.seek(0)
                fh.truncate()
                fh.flush()
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _write_intent(self, intent: dict[str, Any]) -> None:
        self.client.set_registered_model_tag(self.base_name, INTENT_TAG, json.dumps(intent))

    def _clear_intent(self) -> None:
        self._restore_model_tag(INTENT_TAG, None)

    @staticmethod
    def _gate_tags(rid: str, decision: dict[str, Any]) -> dict[str, str]:
        failed = [r["message"] for r in decision["reasons"] if not r["passed"]]
        return {"lattice.gate.decision": decision["decision"], "lattice.gate.run_id": rid,
                "lattice.gate.failed": json.dumps(failed)[:4900]}

    def _finish_decision(self, rid: str, version: int, gate_tags: dict[str, str]) -> None:
        for k, val in gate_tags.items():
            self.client.set_model_version_tag(self.base_name, str(version), k, val)
        self.client.set_tag(rid, PROMOTION_STATUS_TAG, "done")
        self.client.set_terminated(rid, "FINISHED")

    def reconcile(self) -> str | None:
        """Settle a promotion or rollback that a crash interrupted (its intent record is still on
        the registered model): completed when the champion alias already names its target (the
        alias is the commit point), else undone. Decision runs left pending are marked
        rolled_back. Called under `move_lock` by every promote and rollback; returns what it did."""
        from mlflow.exceptions import MlflowException

        try:
            raw = self.client.get_registered_model(self.base_name).tags.get(INTENT_TAG)
        except MlflowException as exc:
            if not _not_found(exc):
                raise
            return None
        note = None
        if raw:
            intent = json.loads(raw)
            champ = self.by_alias(CHAMPION)
            at = champ.version if champ else None
            kind, target, prev = intent["kind"], intent["target"], intent["previous"]
            if at == target:
                self.client.set_registered_model_tag(self.base_name, HISTORY_TAG, json.dumps(intent["history_after"]))
                if kind == "promotion":
                    ch = self.by_alias(CHALLENGER)
                    if intent.get("clear_challenger") and ch is not None and ch.version == target:
                        self.client.delete_registered_model_alias(self.base_name, CHALLENGER)
                    if intent.get("run_id"):
                        self._finish_decision(intent["run_id"], target, intent["gate_tags"])
                else:
                    self.client.set_model_version_tag(self.base_name, str(prev), "lattice.rolled_back", "true")
                note = f"completed the interrupted {kind} of {CHAMPION} from {prev} to v{target}"
            elif at == prev:
                self._restore_model_tag(HISTORY_TAG, intent["history_before"])
                if intent.get("run_id"):
                    self._abandon(intent["run_id"])
                note = f"undid the interrupted {kind} of {CHAMPION} from {prev} to v{target} (the alias had not moved)"
            else:
                raise RuntimeError(
                    f"an interrupted {kind} of {CHAMPION} from {prev} to v{target} was found, but {CHAMPION} is {at}: "
                    f"set the alias and the {HISTORY_TAG} tag of {self.base_name!r} by hand, then delete its {INTENT_TAG} tag")
            self._clear_intent()
            log.warning("registry: %s", note)
        for run in self.client.search_runs([self.experiment_id], f"tags.`{PROMOTION_STATUS_TAG}` = 'pending'"):
            self._abandon(run.info.run_id)  # opened by a promotion that crashed before its intent was written
        self.last_reconciled = note
        return note

    # ------------------------------------------------------------ all or nothing
    def _all_or_nothing(self, what: str, steps: list[tuple[str, Callable[[], Any], Callable[[], Any]]]) -> None:
        """Run each step's action; if one raises, run the undo of every step begun (its own
        included: a write that raised may still have landed), newest first, and re-raise."""
        begun: list[tuple[str, Callable[[], Any]]] = []
        try:
            for label, do, undo in steps:
                begun.append((label, undo))
                do()
        except BaseException as exc:
            failed = []
            for label, undo in reversed(begun):
                try:
                    undo()
                except Exception as err:  # keep undoing the rest
                    failed.append(f"{label}: {type(err).__name__}: {err}")
            if failed:
                note = (f"{what} failed ({type(exc).__name__}: {exc}) and undoing it failed too ({'; '.join(failed)}); "
                        f"check the '{CHAMPION}' alias and the {HISTORY_TAG} tag of {self.base_name!r} "
                        f"at {self.tracking_uri}")
                log.critical(note)
                exc.add_note(note)
            else:
                log.error("%s failed (%s: %s); the registry is as it was before", what, type(exc).__name__, exc)
            raise

    def _set_alias(self, alias: str, version: int | None) -> None:
        from mlflow.exceptions import MlflowException

        if version is not None:
            self.client.set_registered_model_alias(self.base_name, alias, str(version))
            return
        try:
            self.client.delete_registered_model_alias(self.base_name, alias)
        except MlflowException:
            if self.by_alias(alias) is not None:  # not "there was none": a real failure
                raise

    def _restore_model_tag(self, key: str, value: str | None) -> None:
        if value is not None:
            self.client.set_registered_model_tag(self.base_name, key, value)
        elif key in self.client.get_registered_model(self.base_name).tags:
            self.client.delete_registered_model_tag(self.base_name, key)

    def _restore_version_tags(self, version: VersionInfo, before: dict[str, str | None]) -> None:
        now = self.client.get_model_version(version.name, str(version.version)).tags
        for k, v in before.items():
            if v is not None and now.get(k) != v:
                self.client.set_model_version_tag(version.name, str(version.version), k, v)
            elif v is None and k in now:
                self.client.delete_model_version_tag(version.name, str(version.version), k)

    def _abandon(self, rid: str) -> None:
        """Mark a decision run whose promotion was undone (the record of the attempt stays)."""
        self.client.set_tag(rid, PROMOTION_STATUS_TAG, "rolled_back")
        self.client.set_terminated(rid, "FAILED")
