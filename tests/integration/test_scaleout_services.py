"""The scale-out services on loopback: `infra/scale-out up|status|down` in a throwaway home, the
MLflow tracking server as the registry, a Spark job on the standalone cluster, and a worker lost
in the middle of a consolidation (the job completes with the same output as an undisturbed run)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from lattice.config import load_config
from lattice.config.schema import Deployment
from lattice.deploy import local_services as ls
from lattice.deploy import spark_cluster as sc

pytestmark = [pytest.mark.slow, pytest.mark.scaleout]

ROOT = Path(__file__).resolve().parents[2]
ROWS = 3000  # the demo's three domains together: a consolidation of a few dozen tasks


def _free_ports() -> dict[str, int]:
    socks = [socket.socket() for _ in ls.DEFAULT_PORTS]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return {name: s.getsockname()[1] for name, s in zip(ls.DEFAULT_PORTS, socks)}
    finally:
        for s in socks:
            s.close()


def _ours(home: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        try:
            if str(home) in " ".join(p.info["cmdline"] or []) or (p.info["cwd"] or "").startswith(str(home)):
                found.append(p)
        except psutil.Error:
            continue
    return found


# ------------------------------------------------------------------ infra/scale-out up|status|down
def test_scale_out_up_status_down_leaves_no_process_and_no_password(tmp_path):
    home = Path(tempfile.mkdtemp(prefix="lattice-so-cli-"))
    os.chmod(home, 0o755)  # PostgreSQL's own user enters it when we are root
    secrets = tmp_path / "secrets"
    ports = _free_ports()
    env = dict(os.environ, LATTICE_SCALEOUT_HOME=str(home), LATTICE_SCALEOUT_SECRETS=str(secrets),
               LATTICE_SCALEOUT_PORTS=",".join(f"{k}={v}" for k, v in ports.items()))

    def cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
        return subprocess.run([str(ROOT / "infra" / "scale-out"), *args], env=env, capture_output=True, text=True,
                              timeout=timeout)

    outputs = []
    try:
        up = cli("up", timeout=480)
        outputs.append(up.stdout + up.stderr)
        assert up.returncode == 0, up.stdout + up.stderr
        st = cli("status", timeout=60)
        outputs.append(st.stdout + st.stderr)
        assert st.returncode == 0 and "DOWN" not in st.stdout, st.stdout
        for name in ("postgres", "redis", "spark", "mlflow", "prometheus", "airflow"):
            assert re.search(rf"^{name}\s+up\s", st.stdout, re.M), st.stdout
        assert f"spark://127.0.0.1:{ports['spark']} (2/2 workers" in st.stdout
        profile = secrets / "profile.json"
        assert profile.stat().st_mode & 0o777 == 0o600
        assert json.loads(profile.read_text())["mlflow"]["tracking_uri"] == f"http://127.0.0.1:{ports['mlflow']}"
        again = cli("up")  # idempotent: everything is already up, nothing restarts
        outputs.append(again.stdout + again.stderr)
        assert again.returncode == 0, again.stderr
        # every listening socket of our services is on loopback
        for p in _ours(home):
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    assert c.laddr.ip in ("127.0.0.1", "::1", "::ffff:127.0.0.1"), (p.info["cmdline"], c.laddr)
    finally:
        down = cli("down", timeout=120)
        outputs.append(down.stdout + down.stderr)
    assert down.returncode == 0, down.stdout + down.stderr
    left = [p.info["cmdline"] for p in _ours(home)]
    assert not left, left
    assert cli("status", timeout=60).returncode == 1  # all down: status says so

    passwords = json.loads((secrets / "credentials.json").read_text()).values()
    assert all(len(pw) >= 16 for pw in passwords)
    for text in outputs:
        assert not any(pw in text for pw in passwords)
    logs = [f for f in home.rglob("*") if f.is_file() and "postgres/data" not in str(f)]
    assert any(f.name == "mlflow.log" for f in logs) and any(f.name == "spark-worker1.log" for f in logs)
    for f in logs:
        data = f.read_bytes()
        assert not any(pw.encode() in data for pw in passwords), f
    shutil.rmtree(home, ignore_errors=True)


# ------------------------------------------------------------------ MLflow tracking server
def _fake_model(paths, payload: bytes, ne: float) -> None:
    d = paths.model_dir("student")
    (d / "export").mkdir(parents=True, exist_ok=True)
    (d / "export" / "model.pt").write_bytes(payload)
    (d / "export" / "metadata.json").write_text(json.dumps({"trained_at": "2026-01-15T00:00:00Z"}))
    (d / "history.json").write_text(json.dumps([{"epoch": 0, "train_loss": 0.5}]))
    cells = {"feed": {"click": {"ne": ne, "auc": 0.7, "calibration": 1.0}}}
    (d / "metrics.json").write_text(json.dumps({"cells": cells, "macro": {"ne": ne}}))


def _scaleout_config(profile: Path, **top):
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    return cfg.model_copy(update={"deployment": Deployment(profile="scale-out", profile_file=str(profile)), **top})


def test_registry_on_the_tracking_server_registers_loads_and_moves_the_champion(scaleout_mlflow, tmp_path, monkeypatch):
    from lattice.paths import Paths
    from lattice.registry import CHALLENGER, CHAMPION, ModelRegistry
    from lattice.registry.checksum import sha256_path
    from lattice.registry.stages import register

    monkeypatch.delenv("LATTICE_PROFILE_FILE", raising=False)
    layout = scaleout_mlflow
    config = _scaleout_config(layout.profile_file)
    paths = Paths.for_config(config, tmp_path / "wd")
    _fake_model(paths, b"student-1", 0.81)
    register(config, paths, "student")
    reg = ModelRegistry(config, paths)
    assert reg.tracking_uri == f"http://127.0.0.1:{layout.ports['mlflow']}"
    assert not (paths.mlflow / "mlflow.db").exists()  # nothing went to the local SQLite registry
    v1 = reg.by_alias(CHALLENGER)
    assert reg.promote(v1) is None and reg.by_alias(CHAMPION).version == v1.version
    _fake_model(paths, b"student-2", 0.79)
    register(config, paths, "student")
    v2 = reg.by_alias(CHALLENGER)
    assert reg.promote(v2) == v1.version and reg.by_alias(CHAMPION).version == v2.version

    # a second client (another process or machine would do the same) loads the champion's bytes
    other = ModelRegistry(config, Paths.for_config(config, tmp_path / "elsewhere"))
    champ = other.by_alias(CHAMPION)
    local = other.download(champ)
    assert (local / "export" / "model.pt").read_bytes() == b"student-2"
    assert sha256_path(local / "export") == champ.tags["lattice.checksum"]
    # the artifacts live in the server's artifact store, not in either work directory
    stored = [p for p in (layout.home / "mlflow-artifacts").rglob("model.pt")]
    assert {p.read_bytes() for p in stored} >= {b"student-1", b"student-2"}

    # an explicit registry.tracking_uri still wins over the profile
    explicit = f"sqlite:///{tmp_path / 'explicit.db'}"
    cfg2 = _scaleout_config(layout.profile_file, registry=config.registry.model_copy(update={"tracking_uri": explicit}))
    assert ModelRegistry(cfg2, Paths.for_config(cfg2, tmp_path / "wd2")).tracking_uri == explicit


# ------------------------------------------------------------------ Spark standalone
@pytest.fixture(scope="module")
def demo_job(tmp_path_factory, scaleout_spark):
    """A copy of the demo config on a tiny synthetic log, in the scale-out profile of `scaleout_spark`."""
    from lattice.data.synth import generate

    base = tmp_path_factory.mktemp("so-spark")
    text = (ROOT / "configs" / "demo.yaml").read_text()
    text = re.sub(r"^data_root:.*$", f"data_root: {base / 'raw'}", text, flags=re.M)
    text = re.sub(r"^synthetic:.*$", "synthetic: {users: 2000, ads: 500, zipf_exponent: 1.1, days: 14, seed: 42, "
                  "chunk_rows: 5000}", text, flags=re.M)
    text += f"\ndeployment: {{profile: scale-out, profile_file: {scaleout_spark.profile_file}}}\n"
    cfg_file = base / "demo-scaleout.yaml"
    cfg_file.write_text(text)
    generate(load_config(cfg_file), ROWS, base / "raw", progress=False)
    return cfg_file, base


def _consolidate(cfg_file: Path, workdir: Path) -> subprocess.Popen:
    """The consolidation as its own driver process (the test process's local[2] session is shared);
    no --master: the profile's Spark master is the one it must use."""
    env = dict(os.environ, LATTICE_SHUFFLE_PARTITIONS="2", LATTICE_SPARK_MEMORY="1g")
    env.pop("LATTICE_SPARK_MASTER", None)
    env.pop("LATTICE_PROFILE_FILE", None)
    log = open(workdir.parent / f"{workdir.name}.log", "w")
    return subprocess.Popen([sys.executable, str(ROOT / "pipelines" / "consolidate.py"), "--config", str(cfg_file),
                             "--workdir", str(workdir)], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def _table(path: Path):
    import pyarrow.dataset as ds

    df = ds.dataset(str(path), format="parquet", partitioning="hive").to_table().to_pandas()
    df = df[sorted(df.columns)]
    for c in df.columns:  # partition columns come back as dictionaries
        if str(df[c].dtype) == "category":
            df[c] = df[c].astype(str)
    # the example table has an id; the quarantine keeps the raw row: order by the whole row's text
    key = df["example_id"].astype(str) if "example_id" in df else df.astype(str).agg("|".join, axis=1)
    return df.iloc[key.argsort(kind="stable")].reset_index(drop=True)


@pytest.fixture(scope="module")
def undisturbed(demo_job, scaleout_spark):
    cfg_file, base = demo_job
    proc = _consolidate(cfg_file, base / "calm")
    rc = proc.wait(timeout=900)
    assert rc == 0, (base / "calm.log").read_text()[-3000:]
    return base / "calm"


def test_a_spark_job_without_master_runs_on_the_profiles_standalone_cluster(undisturbed, scaleout_spark):
    state = sc._master_state(scaleout_spark)
    apps = [a for a in state["completedapps"] + state["activeapps"] if a["name"] == "lattice-features"]
    assert apps, state  # the job registered with our master instead of running on local[2]
    assert len(_table(undisturbed / "consolidated")) > ROWS * 0.9


def test_losing_a_worker_mid_consolidation_gives_the_same_table(demo_job, undisturbed, scaleout_spark):
    layout = scaleout_spark
    cfg_file, base = demo_job
    before = {a["id"] for a in sc._master_state(layout)["completedapps"]}
    proc = _consolidate(cfg_file, base / "fault")
    try:
        def worker1_busy() -> bool:
            # worker 1's executor has finished a few tasks of this job (so it holds shuffle files and
            # cached blocks that are lost with it) and the job goes on
            apps = [a["id"] for a in sc.active_apps(layout) if a["id"] not in before]
            return any(f.read_text(errors="replace").count("Finished task") >= 3
                       for a in apps for f in (layout.home / "spark" / "work1" / a).glob("*/stderr"))

        deadline = time.monotonic() + 600
        while not worker1_busy():
            assert proc.poll() is None, "the job ended before worker 1 finished 3 tasks"
            assert time.monotonic() < deadline, "worker 1 never finished 3 tasks"
            time.sleep(0.3)
        sc.kill_worker(layout, 1)
        assert proc.poll() is None  # killed mid-job
        rc = proc.wait(timeout=900)
        assert rc == 0, (base / "fault.log").read_text()[-3000:]
        assert sc.alive_workers(layout) == 1  # the job finished on the surviving worker
    finally:
        if proc.poll() is None:
            proc.kill()
        sc.start_worker(layout, 1)  # the cluster whole again for whoever comes next
    import pandas.testing as pdt

    for table in ("consolidated", "quarantine"):
        calm, fault = undisturbed / table, base / "fault" / table
        if calm.exists() or fault.exists():
            pdt.assert_frame_equal(_table(calm), _table(fault))
