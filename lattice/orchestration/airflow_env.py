"""The environment a local Airflow runs in: its home, the repo's dags/ folder, SQLite metadata
DB, LocalExecutor, ports, and the venv's bin on PATH (standalone spawns `airflow` by name).

Airflow reads its settings when it is first imported, so `apply_local_airflow_env` must run
before any `import airflow` in the process.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from lattice.orchestration.locations import project_root


def venv_bin() -> Path:
    return Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_alive(pid: int) -> bool:
    """Whether any process of the group `pid` leads (a component started with
    `start_new_session=True`) still runs. The leader is reaped first when this process started it:
    an exited leader nobody waited for stays a zombie member of its group, and the group then looks
    alive until a stop's timeout (every standalone stop took its full 30 s that way)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child: its own parent reaps it
        pass
    try:
        os.killpg(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def local_airflow_env(home: Path, *, port: int = 8080, host: str = "127.0.0.1",
                      log_ports: tuple[int, int] | None = None, configs_dir: Path | None = None) -> dict[str, str]:
    """Environment variables for a local Airflow (standalone, DagBag or dag.test()) on SQLite."""
    home = Path(home).resolve()
    root = project_root()
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__API__HOST": host,
        "AIRFLOW__API__PORT": str(port),
        # Task workers call back into the API server; without this they dial 8080 and fail with
        # "connection refused" whenever the port is not the default.
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://{host}:{port}/execution/",
        "AIRFLOW__API__BASE_URL": f"http://{host}:{port}",
        # New DAG files show up within seconds instead of minutes.
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "20",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "True",
        # its server listens on every interface at a fixed port by default: loopback, a free port
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST": host,
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(free_port()),
        # On a busy 2-core machine the API server can take seconds to answer a worker; the
        # default 5 s timeout then kills healthy tasks.
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
        # A small machine: a few task slots, not 32 worker processes.
        "AIRFLOW__CORE__PARALLELISM": "4",
        "LATTICE_PROJECT_ROOT": str(root),
        "PATH": f"{venv_bin()}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    if log_ports:
        env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] = str(log_ports[0])
        env["AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"] = str(log_ports[1])
    if configs_dir is not None:
        env["LATTICE_CONFIGS_DIR"] = str(Path(configs_dir).resolve())
    return env


def apply_local_airflow_env(home: Path, **kwargs) -> dict[str, str]:
    """Point this process's (not yet imported) Airflow at `home`; returns what was set."""
    if "airflow" in sys.modules and os.environ.get("AIRFLOW_HOME") != str(Path(home).resolve()):
        raise RuntimeError("airflow was imported before its environment was set; call apply_local_airflow_env first")
    env = local_airflow_env(home, **kwargs)
    Path(home).mkdir(parents=True, exist_ok=True)
    os.environ.update(env)
    return env


def process_test_home() -> Path:
    """One Airflow home per test process, shared by every test module that imports Airflow."""
    import tempfile

    return Path(tempfile.gettempdir()) / f"lattice-airflow-pytest-{os.getpid()}"
