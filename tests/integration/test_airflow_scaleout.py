"""Airflow on the scale-out services (PostgreSQL metadata DB, Redis broker) on loopback: the tiny
config's train_teacher DAG (teacher training under torchrun, evaluation, registration) runs to
success on the LocalExecutor and on the CeleryExecutor with two workers; a viewer is refused a
trigger that an operator may make; no secret reaches a log or the command's output; and the DAG
survives a PostgreSQL restart in the middle of a run. Every Airflow process is gone at the end.

Order matters: the LocalExecutor class runs first, the PostgreSQL restart last (it stops the
shared `scaleout_services` PostgreSQL for a moment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from lattice.deploy import local_services as ls
from lattice.deploy.profile import read_profile, write_profile
from lattice.orchestration import scaleout_airflow
from lattice.orchestration.airflow_env import free_port
from lattice.orchestration.rest import AirflowClient
from tiny_dags import write_tiny_config

ROOT = Path(__file__).resolve().parents[2]
DAG = "tiny__train_teacher"
TASKS = {"train_teacher", "evaluate_teacher", "register_teacher"}

pytestmark = [pytest.mark.slow, pytest.mark.scaleout]


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> Path:
    """A tiny config with its consolidated table written by pandas (no Spark): the teacher DAG
    then has real work to do at once. Manual runs only, no tree baselines (time)."""
    from lattice.config import load_config
    from lattice.data.local_table import write_local_table
    from lattice.data.synth import generate
    from lattice.orchestration.locations import paths_for

    tmp = tmp_path_factory.mktemp("airflow-scaleout")
    cfg = write_tiny_config(ROOT / "configs" / "demo.yaml", tmp / "configs", data_root=tmp / "raw",
                            workdir=tmp / "work", name="tiny")
    data = yaml.safe_load(cfg.read_text())
    data["schedules"] = {f: {} for f in ("features", "train_teacher", "distill", "promote")}
    data["models"]["baselines"].update({"gbdt": False, "gbdt_cell": False})
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    config = load_config(str(cfg))
    generate(config, 3000, Path(config.data_root), progress=False)
    write_local_table(config, paths_for(config).ensure())
    return tmp / "configs"


def _profile(layout: ls.Layout, executor: str) -> Path:
    data = ls.profile_dict(layout)
    data["airflow"] = {"executor": executor, "celery_workers": 2}
    path = layout.secrets / f"profile-{executor}.json"
    write_profile(path, data)
    return path


def _our_processes(home: Path) -> list[str]:
    """Processes still running from this Airflow home (only ours: others run Airflow here too)."""
    left = []
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            if p.environ().get("AIRFLOW_HOME") == str(home):
                left.append(f"{p.pid} {' '.join(p.info['cmdline'] or [])[:120]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return left


def _secrets(layout: ls.Layout, users_file: Path) -> dict[str, str]:
    found = {f"service:{k}": v for k, v in ls.credentials(layout).items()}
    found |= {f"airflow user {u}": p for u, p in json.loads(users_file.read_text()).items()}
    found |= {f"key {k}": v for k, v in json.loads(users_file.with_name("airflow-keys.json").read_text()).items()}
    return found


def _client(af: scaleout_airflow.ScaleoutAirflow, user: str) -> AirflowClient:
    return AirflowClient(af.url, user, json.loads(Path(af.users_file).read_text())[user])


def _run_dag(client: AirflowClient, timeout: float = 900) -> tuple[dict, dict]:
    client.wait_for_dag(DAG, timeout=180)
    client.unpause(DAG)
    resp = client.trigger(DAG, {"epochs": 1, "nproc": 1})
    assert resp.status_code == 200, resp.text
    run = client.wait_run(DAG, resp.json()["dag_run_id"], timeout=timeout)
    return run, {t["task_id"]: t for t in client.task_instances(DAG, run["dag_run_id"])}


def _env() -> dict[str, str]:
    return {**os.environ, "LATTICE_AIRFLOW_RETRIES": "2"}


class TestLocalExecutor:
    def test_the_teacher_dag_runs_on_postgres_with_the_local_executor(self, scaleout_services, configs, tmp_path) -> None:
        svc = read_profile(_profile(scaleout_services, "LocalExecutor"))
        home = tmp_path / "airflow-local"
        af = scaleout_airflow.start(svc, home, configs_dir=configs, users_file=scaleout_services.secrets / "airflow-users.json",
                                    extra_env={"LATTICE_AIRFLOW_RETRIES": "2"})
        try:
            assert set(af.pids) == {"api-server", "scheduler", "dag-processor", "triggerer"}
            assert scaleout_airflow.status(home)["health"]["metadatabase"] == "healthy"
            client = _client(af, "operator")
            run, tis = _run_dag(client)
            assert run["state"] == "success", {t: ti["state"] for t, ti in tis.items()}
            assert set(tis) == TASKS
            client.close()
        finally:
            scaleout_airflow.stop(home)
        assert _our_processes(home.resolve()) == []


@pytest.fixture(scope="class")
def celery_airflow(scaleout_services, configs, tmp_path_factory):
    """Started through `lattice airflow --profile scale-out` (its output kept to check for secrets)."""
    home = tmp_path_factory.mktemp("airflow-celery") / "home"
    profile = _profile(scaleout_services, "CeleryExecutor")
    cmd = [str(Path(sys.executable).parent / "lattice"), "airflow", "--profile", "scale-out", "--profile-file",
           str(profile), "--home", str(home), "--configs", str(configs), "--port", str(free_port()), "--timeout", "400"]
    try:
        out = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=500)
        assert out.returncode == 0, out.stdout + out.stderr
        af = scaleout_airflow.running(home)
        assert af is not None, out.stdout + out.stderr
        yield af, out.stdout + out.stderr
    finally:
        stopped = subprocess.run([*cmd[:2], "--stop", "--home", str(home)], capture_output=True, text=True, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        left = _our_processes(home.resolve())
        assert left == [], f"airflow/celery processes left running: {left}"


class TestCeleryExecutor:
    def test_two_workers_run_the_teacher_dag(self, celery_airflow) -> None:
        af, _ = celery_airflow
        status = scaleout_airflow.status(Path(af.home))
        assert status["executor"] == "CeleryExecutor" and status["running"]
        assert {n for n in status["components"] if n.startswith("worker")} == {"worker1", "worker2"}
        assert set(status["health"].values()) == {"healthy"}
        client = _client(af, "operator")
        run, tis = _run_dag(client)
        assert run["state"] == "success", {t: ti["state"] for t, ti in tis.items()}
        # every task went through the broker to one of our two workers
        received = sum((af.logs / f"worker{i}.log").read_text(errors="replace").count("received") for i in (1, 2))
        assert received >= len(TASKS), f"{received} tasks received by the Celery workers"
        client.close()

    def test_a_viewer_cannot_trigger_and_an_operator_can(self, celery_airflow) -> None:
        af, _ = celery_airflow
        viewer, operator = _client(af, "viewer"), _client(af, "operator")
        assert viewer.dag(DAG)["dag_id"] == DAG  # reading is allowed
        refused = viewer.trigger("tiny__promote", {"dry_run": True})
        assert refused.status_code == 403, refused.text
        assert viewer.http.patch(f"/api/v2/dags/{DAG}", json={"is_paused": True}).status_code == 403
        allowed = operator.trigger("tiny__promote", {"dry_run": True})  # the DAG is paused: the run just waits
        assert allowed.status_code == 200, allowed.text
        bad = httpx_token(af, "viewer", "not-the-password")
        assert bad == 401
        viewer.close()
        operator.close()

    def test_no_secret_in_any_log_or_the_command_output(self, celery_airflow, scaleout_services) -> None:
        af, output = celery_airflow
        secrets = _secrets(scaleout_services, Path(af.users_file))
        assert str(af.users_file) in output  # where to find the passwords, instead of them
        leaks = [f"{name} in the command's output" for name, value in secrets.items() if value in output]
        files = [p for p in Path(af.home).rglob("*") if p.is_file()]  # component, task and migration logs, state
        assert any("dag_id=" in str(p) for p in files), "no task log found under the Airflow home"
        for f in files:
            text = f.read_text(errors="replace")
            leaks += [f"{name} in {f}" for name, value in secrets.items() if value in text]
        assert leaks == []
        assert (Path(af.users_file).stat().st_mode & 0o777) == 0o600

    def test_a_postgres_restart_mid_run_is_survived(self, celery_airflow, scaleout_services) -> None:
        """Last: stops the shared PostgreSQL for a few seconds while the teacher trains."""
        af, _ = celery_airflow
        client = _client(af, "operator")
        client.wait_for_dag(DAG, timeout=180)
        client.unpause(DAG)
        resp = client.trigger(DAG, {"epochs": 1, "nproc": 1})
        assert resp.status_code == 200, resp.text
        run_id = resp.json()["dag_run_id"]
        deadline = time.monotonic() + 300
        while {t["task_id"]: t["state"] for t in client.task_instances(DAG, run_id)}.get("train_teacher") != "running":
            assert time.monotonic() < deadline, "train_teacher never started"
            time.sleep(1)
        ls.stop_postgres(scaleout_services)
        assert not ls.postgres_ready(scaleout_services)
        time.sleep(10)
        ls.start_postgres(scaleout_services)
        run = client.wait_run(DAG, run_id, timeout=900)
        tis = {t["task_id"]: t for t in client.task_instances(DAG, run_id)}
        tries = {t: ti["try_number"] for t, ti in tis.items()}
        print(f"after the PostgreSQL restart: run {run['state']}, tries {tries}")
        assert run["state"] == "success", {t: (ti["state"], ti["try_number"]) for t, ti in tis.items()}
        client.close()


def httpx_token(af: scaleout_airflow.ScaleoutAirflow, user: str, password: str) -> int:
    import httpx

    return httpx.post(f"{af.url}/auth/token", json={"username": user, "password": password}, timeout=30).status_code
