"""The MLflow registry wrapper on a real SQLite backend: logging, versions, aliases, rollback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lattice.config import load_config
from lattice.paths import Paths
from lattice.registry import CHALLENGER, CHAMPION, ModelRegistry
from lattice.registry.checksum import sha256_path
from lattice.registry.stages import register

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config():
    return load_config(ROOT / "configs" / "demo.yaml")


def _fake_model(paths: Paths, model: str, ne: float, payload: bytes) -> Path:
    d = paths.model_dir(model)
    (d / "export").mkdir(parents=True, exist_ok=True)
    (d / "export" / "model.pt").write_bytes(payload)
    (d / "export" / "metadata.json").write_text(json.dumps({"trained_at": "2026-01-15T00:00:00Z"}))
    (d / "plan.json").write_text(json.dumps({"user_id": "table_wise"}))
    (d / "history.json").write_text(json.dumps([{"epoch": 0, "train_loss": 0.5}, {"epoch": 1, "train_loss": 0.4}]))
    cells = {"feed": {"click": {"ne": ne, "auc": 0.7, "calibration": 1.0}}, "search": {"click": {"ne": ne + 0.01, "auc": 0.71}}}
    (d / "metrics.json").write_text(json.dumps({"cells": cells, "macro": {"ne": ne}}))
    return d


def test_register_promote_rollback(config, tmp_path):
    paths = Paths.for_config(config, tmp_path / "wd")
    _fake_model(paths, "teacher", 0.80, b"teacher")
    t = register(config, paths, "teacher")
    assert t["registered_model"] == "demo_ranker_teacher" and t["version"] == 1 and not t["challenger"]

    _fake_model(paths, "student", 0.81, b"student-1")
    s1 = register(config, paths, "student")
    reg = ModelRegistry(config, paths)
    v1 = reg.by_alias(CHALLENGER)
    assert v1 is not None and v1.version == s1["version"] == 1
    assert v1.tags["lattice.checksum"] == sha256_path(paths.model_dir("student") / "export")
    assert v1.tags["lattice.feature_service"] == "demo_v1" and t["feature_service"] == "demo_teacher_v1"
    assert v1.tags["lattice.trained_at"] == "2026-01-15T00:00:00Z"
    run = reg.client.get_run(v1.run_id)
    assert run.data.metrics["cells.feed.click.ne"] == pytest.approx(0.81)
    assert run.data.params["promotion.max_ne_regression"] == str(config.promotion.max_ne_regression)
    arts = {a.path for a in reg.client.list_artifacts(v1.run_id)}
    assert {"model", "plots", "config"} <= arts
    plots = {a.path for a in reg.client.list_artifacts(v1.run_id, "plots")}
    assert plots == {"plots/cells.png", "plots/history.png"}

    # the downloaded artifact is byte-identical to what was registered
    local = reg.download(v1)
    assert sha256_path(local / "export") == v1.tags["lattice.checksum"]

    assert reg.by_alias(CHAMPION) is None
    assert reg.promote(v1) is None
    assert reg.by_alias(CHAMPION).version == 1 and reg.by_alias(CHALLENGER) is None

    _fake_model(paths, "student", 0.79, b"student-2")
    register(config, paths, "student")
    v2 = reg.by_alias(CHALLENGER)
    assert v2.version == 2 and v2.tags["lattice.feature_service"] == "demo_v2"
    from features.store import get_store

    services = {s.name: s for s in get_store(config, paths).list_feature_services()}
    assert set(services) == {"demo_teacher_v1", "demo_v1", "demo_v2"}  # one per registered version
    assert services["demo_v2"].tags == {"version": "2", "model": "student"}
    assert reg.promote(v2) == 1
    assert reg.champion_history() == [1, 2]

    assert reg.rollback() == (2, 1)
    assert reg.by_alias(CHAMPION).version == 1
    assert reg.version(2).tags["lattice.rolled_back"] == "true"
    with pytest.raises(RuntimeError, match="no previous champion"):
        reg.rollback()


def test_decision_is_recorded_on_the_version(config, tmp_path):
    paths = Paths.for_config(config, tmp_path / "wd")
    _fake_model(paths, "student", 0.81, b"s")
    register(config, paths, "student")
    reg = ModelRegistry(config, paths)
    v = reg.by_alias(CHALLENGER)
    decision = {
        "decision": "reject", "passed": False, "failed_cells": ["feed/click"],
        "reasons": [{"check": "ne_vs_champion", "passed": False, "message": "feed/click: NE too high", "cell": "feed/click"}],
        "measurements": {"latency_p99_ms": 1.5},
    }
    rid = reg.log_decision(v, decision)
    tags = reg.version(v.version).tags
    assert tags["lattice.gate.decision"] == "reject" and tags["lattice.gate.run_id"] == rid
    assert json.loads(tags["lattice.gate.failed"]) == ["feed/click: NE too high"]
    assert reg.client.get_run(rid).data.metrics["latency_p99_ms"] == 1.5


def test_register_without_trained_model_says_what_to_run(config, tmp_path):
    with pytest.raises(FileNotFoundError, match="lattice train"):
        register(config, Paths.for_config(config, tmp_path / "wd"), "teacher")


# ---------------------------------------------------------------- integrity, atomic promotion, missing registry


def _stored(reg: ModelRegistry, version) -> Path:
    """The version's `model/` folder inside the MLflow artifact store (the local file backend)."""
    from urllib.parse import unquote, urlparse

    return Path(unquote(urlparse(reg.client.get_run(version.run_id).info.artifact_uri).path)) / "model"


def _flip(path: Path, offset: int = 0, n: int = 1) -> None:
    data = bytearray(path.read_bytes())
    for i in range(offset, min(offset + n, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_download_verifies_every_file_and_never_trusts_a_changed_cache_entry(config, tmp_path):
    from lattice.registry.checksum import MANIFEST_FILE, ArtifactIntegrityError, manifest, manifest_digest
    from lattice.registry.client import MANIFEST_TAG

    paths = Paths.for_config(config, tmp_path / "wd")
    _fake_model(paths, "student", 0.81, b"student-weights" * 100)
    register(config, paths, "student")
    reg = ModelRegistry(config, paths)
    v = reg.by_alias(CHALLENGER)
    own = manifest(paths.model_dir("student"))
    registered = json.loads(Path(reg.client.download_artifacts(v.run_id, MANIFEST_FILE, str(tmp_path))).read_text())
    assert v.tags[MANIFEST_TAG] == manifest_digest(registered)
    # the model's own files, as they were, plus the pyfunc flavour's (lattice.registry.pyfunc)
    assert {k: registered[k] for k in own} == own
    assert set(registered) - set(own) == {"MLmodel", "pyfunc_entry.py", "artifacts/lattice_pyfunc.json", "conda.yaml",
                                          "python_env.yaml", "requirements.txt"}

    local = reg.download(v)
    assert v.tags[MANIFEST_TAG] in str(local)  # keyed by content, not by (name, version)
    assert manifest(local) == registered

    # a changed byte, a removed file or an extra file in the cache entry: a miss, downloaded again
    _flip(local / "export" / "model.pt", 3)
    again = reg.download(v)
    assert manifest(again) == registered
    (again / "metrics.json").unlink()
    (again / "export" / "extra.bin").write_bytes(b"x")
    assert manifest(reg.download(v)) == registered

    # the stored copy itself changed: refused, naming the file, and nothing is cached
    _flip(_stored(reg, v) / "export" / "model.pt", 3)
    _flip(local / "export" / "model.pt", 3)
    with pytest.raises(ArtifactIntegrityError, match="export/model.pt") as err:
        reg.download(v)
    assert err.value.problems == [p for p in err.value.problems if p.startswith("export/model.pt")]
    assert not local.exists()


def test_registration_verifies_the_stored_copy(config, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from lattice.registry.checksum import ArtifactIntegrityError

    paths = Paths.for_config(config, tmp_path / "wd")
    _fake_model(paths, "student", 0.81, b"student-weights")
    real = MlflowClient.log_artifacts

    def corrupting(self, run_id, local_dir, artifact_path=None):
        real(self, run_id, local_dir, artifact_path)
        if artifact_path == "model" and Path(local_dir) == paths.model_dir("student"):  # the store mangles the upload
            uri = self.get_run(run_id).info.artifact_uri
            _flip(Path(uri.removeprefix("file://")) / "model" / "export" / "model.pt")

    monkeypatch.setattr(MlflowClient, "log_artifacts", corrupting)
    with pytest.raises(ArtifactIntegrityError, match="export/model.pt"):
        register(config, paths, "student")
    reg = ModelRegistry(config, paths)
    assert reg.latest("student") is None and reg.by_alias(CHALLENGER) is None  # no version names bad bytes
    runs = reg.client.search_runs([reg.experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]


def test_predictor_refuses_bytes_that_are_not_the_registered_ones(config, tmp_path):
    from lattice.export.predictor import Predictor
    from lattice.registry.checksum import ArtifactIntegrityError

    paths = Paths.for_config(config, tmp_path / "wd")
    _fake_model(paths, "student", 0.81, b"student-weights")
    register(config, paths, "student")
    reg = ModelRegistry(config, paths)
    v = reg.by_alias(CHALLENGER)
    local = reg.download(v)
    _flip(local / "export" / "model.pt")  # changed after the download was verified
    with pytest.raises(ArtifactIntegrityError, match="export/model.pt") as err:
        Predictor.load(local, version=v)  # refused before a byte is deserialised
    assert f"v{v.version}" in str(err.value)
    no_record = type(v)(v.name, v.version, v.run_id, v.source, {k: t for k, t in v.tags.items() if k != "lattice.checksum"})
    with pytest.raises(ArtifactIntegrityError, match="no checksum was recorded"):
        Predictor.load(local, version=no_record)


def test_a_version_registered_before_manifests_is_checked_against_its_checksum(config, tmp_path):
    from lattice.registry.checksum import ArtifactIntegrityError
    from lattice.registry.client import MANIFEST_TAG

    paths = Paths.for_config(config, tmp_path / "wd")
    _fake_model(paths, "student", 0.81, b"student-weights")
    register(config, paths, "student")
    reg = ModelRegistry(config, paths)
    v = reg.by_alias(CHALLENGER)
    reg.client.delete_model_version_tag(v.name, str(v.version), MANIFEST_TAG)
    old = reg.version(v.version)
    assert MANIFEST_TAG not in old.tags
    local = reg.download(old)
    assert sha256_path(local / "export") == old.tags["lattice.checksum"]
    _flip(_stored(reg, old) / "export" / "model.pt")
    _flip(local / "export" / "model.pt")
    with pytest.raises(ArtifactIntegrityError, match="export/"):
        reg.download(old)


class _Lock:
    """Stands in for a locked MLflow database: once armed (right after the champion alias write),
    the `fail_at`-th registry write raises, once; writes before and after it go through."""

    WRITES = ("set_registered_model_alias", "delete_registered_model_alias", "set_registered_model_tag",
              "delete_registered_model_tag", "set_model_version_tag", "delete_model_version_tag", "set_tag", "set_terminated")

    def __init__(self, reg: ModelRegistry, monkeypatch, fail_at: int):
        self.reg, self.fail_at, self.armed, self.writes, self.raised = reg, fail_at, False, 0, False
        self.pending_at_move: list = []
        for name in self.WRITES:
            monkeypatch.setattr(reg.client, name, self._wrap(name, getattr(reg.client, name)))

    def _wrap(self, name, real):
        from mlflow.exceptions import MlflowException

        def call(*args, **kwargs):
            if self.armed and not self.raised:
                self.writes += 1
                if self.writes == self.fail_at:
                    self.raised = True
                    raise MlflowException("(sqlite3.OperationalError) database is locked")
            out = real(*args, **kwargs)
            if name == "set_registered_model_alias" and args[1] == CHAMPION and not self.armed:
                self.armed = True
                self.pending_at_move = self.reg.client.search_runs(
                    [self.reg.experiment_id], "tags.`lattice.promotion.status` = 'pending'")
            return out

        return call


def _passing(message: str = "all checks passed") -> dict:
    return {"decision": "promote", "passed": True, "failed_cells": [], "measurements": {"latency_p99_ms": 1.0},
            "reasons": [{"check": "ne_vs_champion", "passed": True, "message": message, "cell": None}]}


def test_a_failure_after_the_alias_moved_leaves_champion_history_and_record_consistent(config, tmp_path, monkeypatch):
    from mlflow.exceptions import MlflowException

    from lattice.registry.client import GATE_TAGS, PROMOTION_STATUS_TAG

    paths = Paths.for_config(config, tmp_path / "wd")
    _fake_model(paths, "student", 0.81, b"student-1")
    register(config, paths, "student")
    reg = ModelRegistry(config, paths)
    reg.record_promotion(reg.version(1), _passing())
    _fake_model(paths, "student", 0.79, b"student-2")
    register(config, paths, "student")
    reg.log_decision(reg.version(2), {**_passing("dry run"), "dry_run": True})  # tags the version before the attempts
    before = {k: reg.version(2).tags.get(k) for k in GATE_TAGS}

    failures = 0
    for fail_at in range(1, 50):
        with monkeypatch.context() as m:
            lock = _Lock(reg, m, fail_at)
            try:
                rid = reg.record_promotion(reg.version(2), _passing())
            except MlflowException as exc:
                assert "database is locked" in str(exc)
            else:
                assert not lock.raised  # every write after the move has been failed once: it goes through now
                break
        failures += 1
        assert lock.pending_at_move, "the decision must be recorded (pending) before the alias moves"
        # as before the attempt: the previous champion, its history, the challenger and the version's tags
        assert reg.by_alias(CHAMPION).version == 1, fail_at
        assert reg.champion_history() == [1], fail_at
        assert reg.by_alias(CHALLENGER).version == 2, fail_at
        assert {k: reg.version(2).tags.get(k) for k in GATE_TAGS} == before, fail_at
        attempt = reg.client.get_run(lock.pending_at_move[0].info.run_id)
        assert attempt.data.tags[PROMOTION_STATUS_TAG] == "rolled_back" and attempt.info.status == "FAILED", fail_at
    assert failures >= 5  # history, challenger alias, the version's gate tags, the run's status, its end
    assert reg.by_alias(CHAMPION).version == 2 and reg.champion_history() == [1, 2] and reg.by_alias(CHALLENGER) is None
    tags = reg.version(2).tags
    assert tags["lattice.gate.decision"] == "promote" and tags["lattice.gate.run_id"] == rid
    done = reg.client.get_run(rid)
    assert done.data.tags[PROMOTION_STATUS_TAG] == "done" and done.info.status == "FINISHED"


def test_a_failure_after_the_alias_moved_back_undoes_the_rollback(config, tmp_path, monkeypatch):
    from mlflow.exceptions import MlflowException

    paths = Paths.for_config(config, tmp_path / "wd")
    reg = ModelRegistry(config, paths)
    for i in (1, 2):
        _fake_model(paths, "student", 0.8, f"student-{i}".encode())
        register(config, paths, "student")
        reg.promote(reg.version(i))
    for fail_at in (1, 2):
        with monkeypatch.context() as m:
            _Lock(reg, m, fail_at)
            with pytest.raises(MlflowException, match="locked"):
                reg.rollback()
        assert reg.by_alias(CHAMPION).version == 2 and reg.champion_history() == [1, 2]
        assert "lattice.rolled_back" not in reg.version(2).tags
    assert reg.rollback() == (2, 1) and reg.champion_history() == [1]


def test_a_missing_registry_is_an_error_not_a_new_empty_one(config, tmp_path):
    from lattice.registry.client import REGISTRY_MARKER, RegistryMissingError

    paths = Paths.for_config(config, tmp_path / "wd")
    _fake_model(paths, "student", 0.81, b"student-1")
    register(config, paths, "student")  # the first run creates the registry
    db = paths.mlflow / "mlflow.db"
    assert db.is_file() and (paths.mlflow / REGISTRY_MARKER).is_file()
    db.rename(tmp_path / "mlflow.db.moved")
    for attempt in (lambda: ModelRegistry(config, paths), lambda: register(config, paths, "student")):
        with pytest.raises(RegistryMissingError, match="registry.tracking_uri") as err:
            attempt()
        assert str(db) in str(err.value)
        assert not db.exists()  # nothing recreated
    # a registry from before the marker: its artifacts still show it existed
    (paths.mlflow / REGISTRY_MARKER).unlink()
    with pytest.raises(RegistryMissingError, match="artifacts"):
        ModelRegistry(config, paths)
    (tmp_path / "mlflow.db.moved").rename(db)  # restored: the same registry, versions intact
    assert ModelRegistry(config, paths).by_alias(CHALLENGER).version == 1


# ---------------------------------------------------------------- issue 37: the stored copy, locks, crashes


def test_promote_rejects_a_corrupt_stored_copy_even_with_an_intact_cache(config, tmp_path, monkeypatch):
    """Finding 1: one byte flipped where the challenger is stored, this machine's cache intact."""
    import pandas as pd

    import lattice.export.window as window
    from lattice.promotion.stages import promote
    from lattice.registry.checksum import ArtifactIntegrityError

    paths = Paths.for_config(config, tmp_path / "wd")
    _fake_model(paths, "student", 0.81, b"student-1" * 50)
    register(config, paths, "student")
    reg = ModelRegistry(config, paths)
    v1 = reg.version(1)
    cached = reg.download(v1)
    _flip(_stored(reg, v1) / "export" / "model.pt", 5)
    assert reg.download(v1) == cached  # the cache alone would say every file matches

    monkeypatch.setattr(window, "load_window", lambda *a, **k: pd.DataFrame())  # rejected before anything is scored
    out = promote(config, paths)
    assert not out["passed"] and out["champion_after"] is None
    failed = [r for r in out["reasons"] if not r["passed"]]
    assert [r["check"] for r in failed] == ["artifact_integrity"]
    assert "challenger v1" in failed[0]["message"] and "export/model.pt" in failed[0]["message"]
    assert reg.by_alias(CHAMPION) is None and reg.by_alias(CHALLENGER).version == 1
    # the registry's own move refuses it too (any caller, not only the gate), naming the file
    with pytest.raises(ArtifactIntegrityError, match="export/model.pt"):
        reg.record_promotion(v1, _passing())
    assert reg.by_alias(CHAMPION) is None and reg.champion_history() == []


def test_rollback_refuses_a_target_whose_stored_copy_fails(config, tmp_path):
    """Finding 6: rollback from v2 to v1 with v1's stored copy corrupted (its cache intact)."""
    from lattice.cli import main
    from lattice.registry.checksum import ArtifactIntegrityError

    paths = Paths.for_config(config, tmp_path / "wd")
    reg = ModelRegistry(config, paths)
    for i in (1, 2):
        _fake_model(paths, "student", 0.8, f"student-{i}".encode() * 50)
        register(config, paths, "student")
        reg.promote(reg.version(i))
    reg.download(reg.version(1))
    _flip(_stored(reg, reg.version(1)) / "export" / "model.pt", 7)
    with pytest.raises(ArtifactIntegrityError, match="export/model.pt") as err:
        reg.rollback()
    assert "rollback target" in str(err.value) and "stays v2" in str(err.value)
    assert reg.by_alias(CHAMPION).version == 2 and reg.champion_history() == [1, 2]
    assert "lattice.rolled_back" not in reg.version(2).tags
    import yaml

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    assert main(["rollback", str(cfg), "--workdir", str(paths.workdir)]) == 1
    assert reg.by_alias(CHAMPION).version == 2


def _hold_exclusive(db: Path, seconds: float):
    """Another connection holds an exclusive lock on `db` for `seconds` (as a backup or a
    second promote would); returns the thread once the lock is taken."""
    import sqlite3
    import threading

    taken = threading.Event()

    def hold():
        con = sqlite3.connect(db, isolation_level=None, timeout=0.1)
        con.execute("BEGIN EXCLUSIVE")
        taken.set()
        import time

        time.sleep(seconds)
        con.execute("ROLLBACK")
        con.close()

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert taken.wait(10)
    return t


def test_a_locked_registry_is_waited_for_then_reported_never_read_as_absent(config, tmp_path):
    """Finding 3: `by_alias` read "database is locked" as "no champion" and the history lost v1."""
    import time

    from lattice.registry.patience import RegistryUnavailableError

    paths = Paths.for_config(config, tmp_path / "wd")
    reg = ModelRegistry(config, paths)
    for i in (1, 2):
        _fake_model(paths, "student", 0.8, f"student-{i}".encode())
        register(config, paths, "student")
    reg.promote(reg.version(1), verify_stored=False)
    db = paths.mlflow / "mlflow.db"

    # held for about a second: every read waits and returns what is there
    t = _hold_exclusive(db, 1.0)
    started = time.monotonic()
    assert reg.by_alias(CHAMPION).version == 1
    assert time.monotonic() - started >= 0.5  # it did wait for the lock
    t.join()
    t = _hold_exclusive(db, 1.0)
    assert reg.champion_history() == [1] and reg.latest("student").version == 2
    t.join()

    # held past the bound: a clear error naming the file, and a promote changes nothing
    patient = ModelRegistry(config, paths, lock_wait_s=1.0)
    v2 = reg.version(2)
    t = _hold_exclusive(db, 3.0)
    with pytest.raises(RegistryUnavailableError, match="stayed locked") as err:
        patient.by_alias(CHAMPION)
    assert str(db) in str(err.value) and "Held open by" in str(err.value)
    with pytest.raises(RegistryUnavailableError):
        patient.promote(v2, verify_stored=False)
    t.join()
    assert reg.by_alias(CHAMPION).version == 1 and reg.champion_history() == [1]
    assert reg.promote(reg.version(2), verify_stored=False) == 1 and reg.champion_history() == [1, 2]


@pytest.mark.parametrize("content", [b"", b"not a database at all" * 10], ids=["empty", "garbage"])
def test_an_empty_or_garbage_registry_file_is_an_error_not_a_new_registry(config, tmp_path, content):
    """Finding 5: a 0-byte mlflow.db grew into a new empty registry ("no champion")."""
    from lattice.registry.patience import RegistryUnavailableError

    paths = Paths.for_config(config, tmp_path / "wd")
    _fake_model(paths, "student", 0.81, b"student-1")
    register(config, paths, "student")
    db = paths.mlflow / "mlflow.db"
    db.write_bytes(content)
    with pytest.raises(RegistryUnavailableError, match="backup") as err:
        ModelRegistry(config, paths)
    assert str(db) in str(err.value)
    assert db.read_bytes() == content  # nothing created in its place


class _Crash(BaseException):
    """Stands in for SIGKILL: the process stops between two registry writes, and nothing undoes."""


def _crash_after(reg: ModelRegistry, monkeypatch, done: int) -> None:
    """The next promotion or rollback runs its first `done` writes, then dies (no undo runs)."""

    def steps_then_die(what, steps):
        for _label, do, _undo in steps[:done]:
            do()
        raise _Crash(f"killed after {done} of {len(steps)} steps of {what}")

    monkeypatch.setattr(reg, "_all_or_nothing", steps_then_die)


def _pending_runs(reg: ModelRegistry) -> list:
    return reg.client.search_runs([reg.experiment_id], "tags.`lattice.promotion.status` = 'pending'")


def test_a_crash_at_any_step_of_promote_or_rollback_is_settled_by_the_next_one(config, tmp_path, monkeypatch):
    """Finding 2: killed right after the alias moved, the registry said champion v2, history [1],
    challenger v2, a decision stuck pending, and the next promote 'v2 already is the champion'."""
    import pandas as pd

    import lattice.export.window as window
    from lattice.promotion.stages import promote
    from lattice.registry.client import INTENT_TAG, PROMOTION_STATUS_TAG

    paths = Paths.for_config(config, tmp_path / "wd")
    reg = ModelRegistry(config, paths)
    for i in (1, 2):
        _fake_model(paths, "student", 0.8, f"student-{i}".encode())
        register(config, paths, "student")
    reg.record_promotion(reg.version(1), _passing())
    reg.set_challenger(reg.version(2))
    # intent, decision run, alias, history, challenger alias, decision record, intent done
    steps = 7
    for done in range(steps):
        with monkeypatch.context() as m:
            _crash_after(reg, m, done)
            with pytest.raises(_Crash):
                reg.record_promotion(reg.version(2), {**_passing(), "champion_before": 1})
        moved = done >= 3  # the alias write is the third step: the commit point
        with reg.move_lock("test"):
            note = reg.reconcile()
        assert INTENT_TAG not in reg.client.get_registered_model(reg.base_name).tags and not _pending_runs(reg), done
        runs = reg.client.search_runs([reg.experiment_id], "tags.`lattice.model` = 'promotion'", order_by=["start_time DESC"])
        if moved:
            assert "completed the interrupted promotion" in note, done
            assert reg.by_alias(CHAMPION).version == 2 and reg.champion_history() == [1, 2], done
            assert reg.by_alias(CHALLENGER) is None, done
            assert runs[0].data.tags[PROMOTION_STATUS_TAG] == "done" and runs[0].info.status == "FINISHED", done
            assert reg.version(2).tags["lattice.gate.run_id"] == runs[0].info.run_id, done
            # back to the starting state for the next crash point (a rollback, then v2 as challenger)
            assert reg.rollback() == (2, 1)
            reg.client.delete_model_version_tag(reg.base_name, "2", "lattice.rolled_back")
            reg.set_challenger(reg.version(2))
        else:
            assert note is None if done == 0 else "undid the interrupted promotion" in note, done
            assert reg.by_alias(CHAMPION).version == 1 and reg.champion_history() == [1], done
            assert reg.by_alias(CHALLENGER).version == 2, done
            assert runs[0].data.tags[PROMOTION_STATUS_TAG] == "rolled_back" and runs[0].info.status == "FAILED", done

    # finding 2 end to end: killed right after the alias moved, then `lattice promote` again
    with monkeypatch.context() as m:
        _crash_after(reg, m, 3)
        with pytest.raises(_Crash):
            reg.record_promotion(reg.version(2), {**_passing(), "champion_before": 1})
    assert reg.champion_history() == [1]  # torn, as the finding saw it
    monkeypatch.setattr(window, "load_window", lambda *a, **k: pd.DataFrame())
    with pytest.raises(LookupError, match=r"completed the interrupted promotion .* no 'challenger' version"):
        promote(config, paths)
    assert reg.by_alias(CHAMPION).version == 2 and reg.champion_history() == [1, 2]

    # rollback: intent, alias, history, rolled_back tag, intent done
    for done in range(5):
        with monkeypatch.context() as m:
            _crash_after(reg, m, done)
            with pytest.raises(_Crash):
                reg.rollback()
        with reg.move_lock("test"):
            reg.reconcile()
        if done >= 2:
            assert reg.by_alias(CHAMPION).version == 1 and reg.champion_history() == [1], done
            assert reg.version(2).tags["lattice.rolled_back"] == "true", done
            reg.promote(reg.version(2))
            reg.client.delete_model_version_tag(reg.base_name, "2", "lattice.rolled_back")
        else:
            assert reg.by_alias(CHAMPION).version == 2 and reg.champion_history() == [1, 2], done
            assert "lattice.rolled_back" not in reg.version(2).tags, done


def test_a_second_promote_waits_for_the_first_then_reports_the_holder(config, tmp_path):
    import threading
    import time

    paths = Paths.for_config(config, tmp_path / "wd")
    _fake_model(paths, "student", 0.8, b"student-1")
    register(config, paths, "student")
    first, second = ModelRegistry(config, paths), ModelRegistry(config, paths)
    second.move_lock_wait_s = 0.5
    held, release = threading.Event(), threading.Event()

    def hold():
        with first.move_lock("promotion of v9"):
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert held.wait(5)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"another promote or rollback holds .*promotion.lock .*promotion of v9"):
        second.promote(second.version(1), verify_stored=False)
    assert time.monotonic() - started >= 0.5 and second.by_alias(CHAMPION) is None
    release.set()
    t.join()
    second.move_lock_wait_s = 5.0
    assert second.promote(second.version(1)) is None and second.by_alias(CHAMPION).version == 1


def test_apply_gate_carries_out_the_recorded_decision_and_nothing_else(config, tmp_path):
    """The DAGs' `promote_challenger` step: it moves the champion only on the gate's recorded pass
    for the current challenger; a recorded reject comes back as is (the task is then skipped) and
    moves nothing; a champion that moved since the gate is refused."""
    from lattice.promotion.stages import apply_gate

    paths = Paths.for_config(config, tmp_path / "wd")
    _fake_model(paths, "student", 0.81, b"student-1")
    register(config, paths, "student")
    reg = ModelRegistry(config, paths)
    v1 = reg.by_alias(CHALLENGER)
    from lattice.orchestration.task_runner import NotYet

    with pytest.raises(NotYet, match="no gate decision yet"):  # a waiting gate: the demo and `lattice run` go on
        apply_gate(config, paths)
    reject = {**_passing(), "decision": "reject", "passed": False, "challenger_version": 1, "champion_before": None,
              "champion_after": None, "dry_run": False}
    rid = reg.log_decision(v1, reject)
    out = apply_gate(config, paths)
    assert out["passed"] is False and out["gated_by"] == rid
    assert reg.by_alias(CHAMPION) is None and reg.by_alias(CHALLENGER).version == 1

    gated = {**_passing(), "challenger_version": 1, "champion_before": None, "champion_after": None, "dry_run": False}
    reg.log_decision(v1, {**gated, "dry_run": True})
    assert apply_gate(config, paths)["moved"] is False and reg.by_alias(CHAMPION) is None  # a dry run's pass
    rid = reg.log_decision(v1, gated)
    assert apply_gate(config, paths, dry_run=True)["moved"] is False and reg.by_alias(CHAMPION) is None
    out = apply_gate(config, paths)
    assert out["moved"] is True and out["champion_after"] == 1 and out["gated_by"] == rid
    assert reg.by_alias(CHAMPION).version == 1 and reg.champion_history() == [1]

    # v3 gated against champion v1, then v2 is promoted by someone else: the move is refused
    _fake_model(paths, "student", 0.80, b"student-2")
    register(config, paths, "student")
    v2 = reg.by_alias(CHALLENGER)
    _fake_model(paths, "student", 0.79, b"student-3")
    register(config, paths, "student")
    v3 = reg.by_alias(CHALLENGER)
    reg.log_decision(v3, {**gated, "challenger_version": 3, "champion_before": 1})
    reg.promote(v2)
    with pytest.raises(RuntimeError, match="champion changed from 1 to 2"):
        apply_gate(config, paths)
    assert reg.by_alias(CHAMPION).version == 2 and reg.champion_history() == [1, 2]
