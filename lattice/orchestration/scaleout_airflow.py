"""Airflow on the scale-out services: metadata DB on PostgreSQL, LocalExecutor or CeleryExecutor
(Redis broker, PostgreSQL result backend, `celery_workers` workers), users with roles.

`airflow standalone` forces the LocalExecutor, so each component runs as its own process (in its
own session, so `stop` ends it and every task it forked): api-server, scheduler, dag-processor,
triggerer and the Celery workers. Their pids go to `<home>/lattice-scaleout.json`. Each runs under
`keepalive`, because the scheduler, dag-processor and triggerer exit when PostgreSQL restarts.

Credentials (database and broker URLs, the JWT secret, the Fernet key) reach Airflow through the
environment only: never on a command line (`ps` shows those) and never in a log line we write.
"""

from __future__ import annotations

import json
import os
import secrets as _secrets
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lattice.deploy.profile import Services, redact
from lattice.orchestration import airflow_users
from lattice.orchestration.airflow_env import free_port, group_alive, local_airflow_env, venv_bin

STATE_FILE = "lattice-scaleout.json"
HEALTHY = ("metadatabase", "scheduler", "triggerer", "dag_processor")
EXECUTORS = ("LocalExecutor", "CeleryExecutor")


@dataclass(frozen=True)
class ScaleoutAirflow:
    home: str
    host: str
    port: int
    executor: str
    users_file: str
    pids: dict[str, int] = field(default_factory=dict)  # component -> pid (= its process group)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def logs(self) -> Path:
        return Path(self.home) / "logs"

    def alive(self) -> dict[str, bool]:
        return {name: group_alive(pid) for name, pid in self.pids.items()}


def default_users_file(svc: Services) -> Path:
    """Next to the profile (owner-only, outside the repository)."""
    base = svc.source.parent if svc.source else Path("~/.lattice/scale-out").expanduser()
    return base / "airflow-users.json"


def _keys(users_file: Path) -> dict[str, str]:
    """JWT secret and Fernet key every component must share: generated once, kept next to the
    users file (owner-only, outside the repository and the Airflow home)."""
    file = users_file.with_name("airflow-keys.json")
    if file.exists():
        return json.loads(file.read_text())
    from cryptography.fernet import Fernet

    keys = {"jwt_secret": _secrets.token_urlsafe(32), "fernet_key": Fernet.generate_key().decode()}
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(keys, f)
    return keys


def airflow_env(svc: Services, home: Path, *, port: int, host: str = "127.0.0.1", users_file: Path,
                configs_dir: Path | None = None) -> dict[str, str]:
    """Every setting of the scale-out Airflow as environment variables (they hold secrets)."""
    if svc.postgres is None:
        raise ValueError("the scale-out profile has no `postgres` section: Airflow's metadata DB needs one")
    executor = svc.airflow_executor
    if executor not in EXECUTORS:
        raise ValueError(f"profile airflow.executor is {executor!r}; use one of {EXECUTORS}")
    keys = _keys(Path(users_file))
    env = local_airflow_env(home, port=port, host=host, log_ports=(free_port(), free_port()), configs_dir=configs_dir)
    env.update({
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": svc.airflow_sql_alchemy_conn,
        # a connection that died with a PostgreSQL restart is noticed and replaced, not handed out
        "AIRFLOW__DATABASE__SQL_ALCHEMY_POOL_PRE_PING": "True",
        # Airflow derives an asyncpg URL for its async engine, and asyncpg is not installed; an
        # empty value turns that engine off. Only multi-team and async-only APIs (the dag-run
        # `wait` stream, async state-store reads) use it; install asyncpg and drop this to get them.
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": "",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_POOL_RECYCLE": "300",
        "AIRFLOW__CORE__EXECUTOR": executor,
        "AIRFLOW__API_AUTH__JWT_SECRET": keys["jwt_secret"],
        "AIRFLOW__CORE__FERNET_KEY": keys["fernet_key"],
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": airflow_users.users_setting(airflow_users.SCALE_OUT_USERS),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(users_file),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
    })
    if executor == "CeleryExecutor":
        if svc.redis is None:
            raise ValueError("airflow.executor is CeleryExecutor but the profile has no `redis` section (its broker)")
        env.update({
            "AIRFLOW__CELERY__BROKER_URL": svc.celery_broker_url,
            "AIRFLOW__CELERY__RESULT_BACKEND": svc.celery_result_backend,
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "1",  # two workers x one slot on a small machine
            # stages start children (torchrun, Spark, DataLoader workers): a prefork pool process is
            # daemonic and may not have any ("daemonic processes are not allowed to have children")
            "AIRFLOW__CELERY__POOL": "solo",
            # a task whose worker died is handed to another one instead of waiting for it
            "AIRFLOW__CELERY__TASK_ACKS_LATE": "True",
        })
    return env


def _spawn(name: str, args: list[str], env: dict[str, str], home: Path) -> int:
    """One component under `keepalive` (restarted when it exits, e.g. on a database restart)."""
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "lattice.orchestration.keepalive", str(venv_bin() / "airflow"), *args]
    with open(logs / f"{name}.log", "ab") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=home, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    return proc.pid


def workers(svc: Services) -> int:
    return max(svc.celery_workers, 1) if svc.airflow_executor == "CeleryExecutor" else 0


def start(svc: Services, home: Path, *, port: int | None = None, host: str = "127.0.0.1",
          configs_dir: Path | None = None, users_file: Path | None = None, extra_env: dict[str, str] | None = None,
          wait: bool = True, timeout: float = 300.0) -> ScaleoutAirflow:
    """Migrate the metadata DB, start every component and (with `wait`) return once all are healthy."""
    home = Path(home).resolve()
    current = running(home)
    if current is not None:
        return current
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    users_file = Path(users_file or default_users_file(svc))
    airflow_users.ensure_passwords(users_file, airflow_users.SCALE_OUT_USERS)
    port = port or free_port()
    # an Airflow setting inherited from the caller (a shell, or a process that set up an embedded
    # Airflow, as the test suite does) must not leak into this one: the profile decides
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env = {**inherited, **airflow_env(svc, home, port=port, host=host, users_file=users_file,
                                      configs_dir=configs_dir), **(extra_env or {})}
    # Airflow imports <home>/config/airflow_local_settings.py in every process before any provider
    (home / "config").mkdir(exist_ok=True)
    (home / "config" / "airflow_local_settings.py").write_text(
        "from lattice.orchestration.celery_compat import install\n\ninstall()\n")
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "db-migrate.log", "ab") as out:
        r = subprocess.run([str(venv_bin() / "airflow"), "db", "migrate"], env=env, cwd=home, stdout=out,
                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"`airflow db migrate` failed (exit {r.returncode}); see {logs / 'db-migrate.log'}:\n"
                           + redact(_tail(logs / "db-migrate.log")))
    # Airflow's task-log server listens on every interface (its host is hard-coded): on one machine
    # the api-server reads the task logs from the shared log folder instead, so none is started
    args = {"scheduler": ["scheduler", "--skip-serve-logs"], "triggerer": ["triggerer", "--skip-serve-logs"]}
    pids = {name: _spawn(name, args.get(name, [name]), env, home) for name in ("api-server", "scheduler", "dag-processor", "triggerer")}
    for i in range(1, workers(svc) + 1):
        pids[f"worker{i}"] = _spawn(f"worker{i}", ["celery", "worker", "--concurrency", "1", "--skip-serve-logs",
                                                   "--celery-hostname", f"lattice-w{i}@%h"], env, home)
    af = ScaleoutAirflow(home=str(home), host=host, port=port, executor=svc.airflow_executor,
                         users_file=str(users_file), pids=pids)
    (home / STATE_FILE).write_text(json.dumps(asdict(af)))
    if wait:
        try:
            wait_ready(af, timeout=timeout)
        except Exception:
            stop(home)
            raise
    return af


def _tail(file: Path, lines: int = 30) -> str:
    try:
        return "\n".join(file.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _load(home: Path) -> ScaleoutAirflow | None:
    state = Path(home).resolve() / STATE_FILE
    return ScaleoutAirflow(**json.loads(state.read_text())) if state.exists() else None


def running(home: Path) -> ScaleoutAirflow | None:
    af = _load(home)
    return af if af is not None and all(af.alive().values()) else None


def _workers_ready(af: ScaleoutAirflow) -> bool:
    # Celery prints "<name> ready." once it consumes from the broker
    return all("ready." in (af.logs / f"{n}.log").read_text(errors="replace")
               for n in af.pids if n.startswith("worker"))


def health(af: ScaleoutAirflow, timeout: float = 5.0) -> dict:
    import httpx

    return httpx.get(f"{af.url}/api/v2/monitor/health", timeout=timeout).json()


def wait_ready(af: ScaleoutAirflow, timeout: float = 300.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    last = "not started"
    while time.monotonic() < deadline:
        dead = [n for n, ok in af.alive().items() if not ok]
        if dead:
            raise RuntimeError(f"airflow {dead} exited during start-up; see {af.logs}/{dead[0]}.log:\n"
                               + redact(_tail(af.logs / f"{dead[0]}.log")))
        try:
            h = health(af)
            states = {c: (h.get(c) or {}).get("status") for c in HEALTHY}
            last = ", ".join(f"{c}={s}" for c, s in states.items())
            if all(s == "healthy" for s in states.values()) and _workers_ready(af):
                return
        except (httpx.HTTPError, ValueError) as exc:
            last = type(exc).__name__
        time.sleep(2)
    raise TimeoutError(f"scale-out airflow not ready after {timeout:.0f}s ({last}); logs in {af.logs}")


def status(home: Path) -> dict:
    """What runs from `home`: url, executor, each component's pid and liveness, the API's health."""
    af = _load(home)
    if af is None:
        return {"running": False, "home": str(Path(home).resolve())}
    alive = af.alive()
    out = {"running": all(alive.values()), "home": af.home, "url": af.url, "executor": af.executor,
           "users_file": af.users_file, "components": {n: {"pid": af.pids[n], "alive": ok} for n, ok in alive.items()}}
    try:
        out["health"] = {c: (v or {}).get("status") for c, v in health(af).items()}
    except Exception as exc:  # down or busy: status reports, it does not fail
        out["health"] = {"error": type(exc).__name__}
    return out


def stop(home: Path, timeout: float = 30.0) -> dict:
    """Stop every component `start` launched from `home` (each whole process group)."""
    af = _load(home)
    if af is None:
        return {"stopped": []}
    for pid in af.pids.values():
        if group_alive(pid):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(group_alive(p) for p in af.pids.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in af.pids.values():
        if group_alive(pid):
            os.killpg(pid, signal.SIGKILL)  # a Celery worker waiting on a long task
    (Path(af.home) / STATE_FILE).unlink(missing_ok=True)
    return {"stopped": sorted(af.pids)}


def ready(home: Path) -> bool:
    """Every component alive and the API reports each healthy (for `infra/scale-out status`)."""
    st = status(home)
    return st["running"] and set(st.get("health", {}).values()) == {"healthy"}
