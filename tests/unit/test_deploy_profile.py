"""The scale-out profile file: errors that name the fix, owner-only permissions, redaction, and the
consumers (Spark master, MLflow tracking URI) that follow the profile."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lattice.config import load_config
from lattice.config.schema import Deployment
from lattice.deploy import local_services as ls
from lattice.deploy.profile import ProfileError, read_profile, redact, services, write_profile
from pipelines.spark import _loopback, resolve_master

ROOT = Path(__file__).resolve().parents[2]
PW = "s3cr3tpassw0rd"


def _profile(tmp_path: Path) -> Path:
    layout = ls.Layout(home=tmp_path / "home", secrets=tmp_path / "secrets")
    path = layout.profile_file
    write_profile(path, ls.profile_dict(layout))
    return path


def _scaleout(path: Path, **registry):
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    return cfg.model_copy(update={"deployment": Deployment(profile="scale-out", profile_file=str(path)),
                                  "registry": cfg.registry.model_copy(update=registry)})


def test_a_missing_profile_file_names_the_command_that_writes_it(tmp_path):
    with pytest.raises(ProfileError, match=r"does not exist.*infra/scale-out up"):
        read_profile(tmp_path / "nope.json")


def test_a_profile_readable_by_others_is_refused_with_the_chmod(tmp_path):
    path = _profile(tmp_path)
    assert path.stat().st_mode & 0o777 == 0o600
    os.chmod(path, 0o644)
    with pytest.raises(ProfileError, match=rf"readable by others.*chmod 600 {path}"):
        read_profile(path)


def test_a_missing_key_is_named(tmp_path):
    path = _profile(tmp_path)
    raw = json.loads(path.read_text())
    del raw["postgres"]["password"]
    del raw["version"]
    write_profile(path, raw)
    with pytest.raises(ProfileError, match=r"`postgres\.password` is missing"):
        read_profile(path)
    raw.pop("spark")
    write_profile(path, raw)
    with pytest.raises(ProfileError, match=r"`spark\.master` is missing"):
        read_profile(path)


def test_bad_json_names_the_line(tmp_path):
    path = _profile(tmp_path)
    path.write_text("{\n  oops")
    with pytest.raises(ProfileError, match=r"not valid JSON .* line 2"):
        read_profile(path)


def test_redact_hides_every_password():
    text = (f"postgresql+psycopg2://lattice:{PW}@127.0.0.1:5433/db and redis://:{PW}@127.0.0.1:6380/1 "
            f"and 127.0.0.1:6380,password={PW},db=0")
    out = redact(text)
    assert PW not in out and out.count("***") == 3
    assert "127.0.0.1:5433/db" in out and "lattice:" in out


def test_consumers_follow_the_profile_and_an_explicit_setting_wins(tmp_path, monkeypatch):
    monkeypatch.delenv("LATTICE_SPARK_MASTER", raising=False)
    monkeypatch.delenv("LATTICE_PROFILE_FILE", raising=False)
    path = _profile(tmp_path)
    cfg = _scaleout(path)
    svc = services(cfg)
    assert svc.scale_out and svc.spark_master == f"spark://127.0.0.1:{ls.DEFAULT_PORTS['spark']}"
    assert resolve_master(None, cfg) == svc.spark_master
    assert resolve_master("local[1]", cfg) == "local[1]"  # --master wins
    assert resolve_master(None, load_config(ROOT / "configs" / "demo.yaml")) == "local[2]"  # embedded unchanged
    assert resolve_master(None, None) == "local[2]"
    # a driver for a loopback master binds loopback; a remote master's driver is the environment's
    assert _loopback("local[2]") and _loopback(svc.spark_master) and not _loopback("spark://10.0.0.5:7077")

    from lattice.registry.client import _profile_tracking_uri

    assert _profile_tracking_uri(cfg) == svc.mlflow_tracking_uri == f"http://127.0.0.1:{ls.DEFAULT_PORTS['mlflow']}"
    assert _profile_tracking_uri(load_config(ROOT / "configs" / "demo.yaml")) is None


def test_a_run_resolves_the_profile_once_and_its_stages_read_that(tmp_path, monkeypatch):
    """The run context reads the profile file before its first step; the Spark master, the Feast
    store and the MLflow URI its stages ask for come from that one reading, even after the file
    changed (or vanished) mid-run, and a domain subset's copy of the config keeps it."""
    from features.repo import store_config
    from lattice.orchestration.narrow import narrow_config
    from lattice.orchestration.task_runner import RunContext
    from lattice.paths import Paths
    from lattice.registry.client import _profile_tracking_uri

    path = _profile(tmp_path)
    cfg = _scaleout(path)
    ctx = RunContext(cfg, Paths.for_config(cfg, tmp_path / "work"))
    master = ctx.services.spark_master
    assert master.startswith("spark://")
    path.unlink()  # what a stage reads from now on can only be the run's own resolution
    sub = narrow_config(cfg, ["feed"], None)
    assert resolve_master(None, sub) == master
    assert store_config(sub, Paths.for_config(sub, tmp_path / "work"))["online_store"]["type"] == "redis"
    assert _profile_tracking_uri(sub) == ctx.services.mlflow_tracking_uri
    # a copy with another deployment section is not served the old resolution
    with pytest.raises(ProfileError, match="does not exist"):
        services(_scaleout(tmp_path / "other.json"))


def test_a_run_with_a_missing_profile_fails_before_any_stage(tmp_path):
    from lattice.orchestration.task_runner import DeterministicError, RunContext
    from lattice.paths import Paths

    cfg = _scaleout(tmp_path / "nope.json")
    with pytest.raises(DeterministicError, match=r"nope.json.*infra/scale-out up"):
        RunContext(cfg, Paths.for_config(cfg, tmp_path / "work"))
