"""Start and stop a local `airflow standalone` (scheduler, dag-processor, api-server, triggerer on
SQLite with the LocalExecutor) whose DAGs folder is the repo's `dags/`.

The process group id, port and log file are written to `<home>/lattice-standalone.json`, so
`stop` ends exactly the processes `start` launched and nothing else.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from lattice.orchestration.airflow_env import free_port, group_alive, local_airflow_env, venv_bin
from lattice.orchestration.airflow_users import EMBEDDED_USERS, ensure_passwords
from lattice.orchestration.locations import project_root

STATE_FILE = "lattice-standalone.json"
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"
COMPONENTS = ("metadatabase", "scheduler", "triggerer", "dag_processor")


def default_home() -> Path:
    return project_root() / ".lattice" / "airflow"


@dataclass(frozen=True)
class Standalone:
    home: str
    pid: int
    port: int
    host: str
    log_file: str

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def credentials(self) -> tuple[str, str]:
        """(user, password) Airflow generated for the simple auth manager on first start."""
        users = json.loads(self.passwords_file.read_text())
        user = "admin" if "admin" in users else next(iter(users))
        return user, users[user]

    @property
    def passwords_file(self) -> Path:
        return Path(self.home) / PASSWORDS_FILE

    def alive(self) -> bool:
        return group_alive(self.pid)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(Path(self.log_file).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def running(home: Path | None = None) -> Standalone | None:
    state = Path(home or default_home()) / STATE_FILE
    if not state.exists():
        return None
    sa = Standalone(**json.loads(state.read_text()))
    return sa if sa.alive() else None


def start(home: Path | None = None, *, port: int = 8080, host: str = "127.0.0.1", extra_env: dict[str, str] | None = None,
          configs_dir: Path | None = None) -> Standalone:
    """Launch `airflow standalone` in its own process group (returns at once; see `wait_ready`)."""
    home = Path(home or default_home()).resolve()
    if (current := running(home)) is not None:
        raise RuntimeError(f"airflow standalone already runs from {home} at {current.url} (pid {current.pid}); "
                           "stop it with `lattice airflow --stop`")
    home.mkdir(parents=True, exist_ok=True)
    # written by us, owner-only, before Airflow starts: Airflow then finds the admin's password
    # and never prints it (it prints every password it generates, into standalone.log)
    ensure_passwords(home / PASSWORDS_FILE, EMBEDDED_USERS)
    env = {**os.environ, **local_airflow_env(home, port=port, host=host, log_ports=(free_port(), free_port()),
                                             configs_dir=configs_dir), **(extra_env or {})}
    # the scheduler's and triggerer's task-log servers: on `host` too, not every interface
    from lattice.orchestration.loopback_logs import HOST_ENV, write_settings

    write_settings(home)
    env[HOST_ENV] = host
    log_file = home / "standalone.log"
    with open(log_file, "ab") as out:
        proc = subprocess.Popen([str(venv_bin() / "airflow"), "standalone"], env=env, cwd=home, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    sa = Standalone(home=str(home), pid=proc.pid, port=port, host=host, log_file=str(log_file))
    (home / STATE_FILE).write_text(json.dumps(asdict(sa)))
    return sa


def health(sa: Standalone, timeout: float = 5.0) -> dict:
    import httpx

    return httpx.get(f"{sa.url}/api/v2/monitor/health", timeout=timeout).json()


def wait_ready(sa: Standalone, timeout: float = 240.0, progress=None) -> None:
    """Until the API answers, every component reports healthy and the login exists."""
    import httpx

    deadline = time.monotonic() + timeout
    last = "not started"
    while time.monotonic() < deadline:
        if not sa.alive():
            raise RuntimeError(f"airflow standalone exited during start-up; last log lines:\n{sa.log_tail()}")
        try:
            h = health(sa)
            states = {c: (h.get(c) or {}).get("status") for c in COMPONENTS}
            last = ", ".join(f"{c}={s}" for c, s in states.items())
            if all(s == "healthy" for s in states.values()) and sa.passwords_file.exists():
                return
        except (httpx.HTTPError, ValueError) as exc:
            last = type(exc).__name__
        if progress:
            progress(last)
        time.sleep(2)
    raise TimeoutError(f"airflow standalone not ready after {timeout:.0f}s ({last}); log: {sa.log_file}\n{sa.log_tail()}")


def stop(home: Path | None = None, timeout: float = 30.0) -> Standalone | None:
    """Stop the standalone that `start` launched from `home` (its whole process group)."""
    home = Path(home or default_home()).resolve()
    state = home / STATE_FILE
    if not state.exists():
        return None
    sa = Standalone(**json.loads(state.read_text()))
    if sa.alive():
        os.killpg(sa.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while sa.alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        if sa.alive():
            os.killpg(sa.pid, signal.SIGKILL)
    state.unlink(missing_ok=True)
    return sa


def pick_port(preferred: int, host: str = "127.0.0.1") -> int:
    """`preferred` when it is free, else any free port."""
    import socket

    with socket.socket() as s:
        try:
            s.bind((host, preferred))
            return preferred
        except OSError:
            return free_port()
