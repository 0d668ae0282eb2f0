"""Issue 37 findings 4, 5 and 6 on the serving side: /healthz and /metadata say which version is
served, which the registry names and why they differ; "ok" only when they agree. A registry
database replaced under a long-lived reader is reopened (finding 4)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from lattice.config import load_config
from lattice.paths import Paths
from lattice.registry import CHAMPION, ModelRegistry
from lattice.registry.checksum import ArtifactIntegrityError
from lattice.registry.patience import RegistryUnavailableError
from lattice.registry.stages import register
from lattice.serving.app import create_app
from lattice.serving.slot import ModelSlot

from test_serving_hardening import GOOD, _Model, _server  # the stand-in model and online store

ROOT = Path(__file__).resolve().parents[2]
PASSING = {"decision": "promote", "passed": True, "reasons": [{"check": "all", "passed": True, "message": "ok"}]}


@pytest.fixture(scope="module")
def config():
    return load_config(ROOT / "configs" / "demo.yaml")


class _Registry:
    """What the slot asks: the champion's version, or an error as the real registry raises it."""

    def __init__(self):
        self.named, self.error = 1, None

    def __call__(self):
        if self.error is not None:
            raise self.error
        return self.named


def _client(config, reg: _Registry, refuse: set[int]):
    server = _server(config)

    def load(version: int):
        if version in refuse:
            raise ArtifactIntegrityError(f"v{version}", [f"export/model.pt: sha256 differs (v{version})"])
        return _Model(config)

    server.slot = ModelSlot(reg, load, poll_seconds=3600)
    paths = Paths(workdir=Path(tempfile.mkdtemp(prefix="lattice-truth-")), data_root=ROOT)
    return TestClient(create_app(config, paths, server=server)), server


def test_health_is_ok_only_when_served_and_named_agree(config):
    reg = _Registry()
    client, server = _client(config, reg, refuse={2})
    with client:
        h = client.get("/healthz").json()
        assert h["status"] == "ok" and h["registry"]["served_version"] == h["registry"]["registry_version"] == 1

        # finding 6: the registry names a version whose artifact is refused; v1 keeps serving
        reg.named = 2
        server.slot.refresh()
        resp = client.get("/healthz")
        h = resp.json()
        assert resp.status_code == 200 and h["status"] == "refused", h
        assert h["registry"]["served_version"] == 1 and h["registry"]["registry_version"] == 2
        assert "sha256 differs" in h["registry"]["reason"]
        assert client.get("/healthz?strict=true").status_code == 503
        meta = client.get("/metadata").json()
        assert meta["model_version"] == 1 and meta["registry"]["status"] == "refused"
        assert client.post("/predict", json=GOOD).json()["model_version"] == 1  # still answering

        # finding 5: an unreadable registry (truncated file) is said, never "ok" or silent
        reg.error = RegistryUnavailableError("the model registry database /x/mlflow.db is empty (0 bytes)")
        server.slot.refresh()
        h = client.get("/healthz").json()
        assert h["status"] == "registry_unreadable" and "0 bytes" in h["registry"]["reason"], h

        # readable again, naming the served version: ok
        reg.error, reg.named = None, 1
        server.slot.refresh()
        assert client.get("/healthz").json()["status"] == "ok"


def _fake_student(paths: Paths, payload: bytes) -> None:
    import json

    d = paths.model_dir("student")
    (d / "export").mkdir(parents=True, exist_ok=True)
    (d / "export" / "model.pt").write_bytes(payload)
    (d / "metrics.json").write_text(json.dumps({"macro": {"ne": 0.8}}))


def test_a_replaced_database_is_reopened_by_a_long_lived_reader(config, tmp_path):
    """Finding 4: the operator restores mlflow.db from a backup (delete, copy back: a new file);
    a reader that had it open reads the restored file at its next poll, not the deleted one."""
    paths = Paths.for_config(config, tmp_path / "wd")
    writer = ModelRegistry(config, paths)
    for i in (1, 2):
        _fake_student(paths, f"student-{i}".encode() * 64)
        register(config, paths, "student")
    writer.record_promotion(writer.version(1), {**PASSING, "champion_before": None}, verify_stored=False)
    db = paths.mlflow / "mlflow.db"
    backup = tmp_path / "backup.db"
    shutil.copyfile(db, backup)  # champion 1

    reader = ModelRegistry(config, paths)  # the server's
    writer.record_promotion(writer.version(2), {**PASSING, "champion_before": 1}, verify_stored=False)
    assert not reader.watch_database() and reader.by_alias(CHAMPION).version == 2

    db.unlink()
    with pytest.raises(FileNotFoundError, match="mlflow.db"):  # gone: an error, never "no champion"
        reader.watch_database()
    shutil.copyfile(backup, db)  # restored: a new file at the same path
    assert reader.watch_database()
    assert reader.by_alias(CHAMPION).version == 1  # the restored file's champion, not the deleted one's

    db.write_bytes(b"")  # truncated
    with pytest.raises(RegistryUnavailableError, match="0 bytes"):
        reader.watch_database()
