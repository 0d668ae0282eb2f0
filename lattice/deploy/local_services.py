"""PostgreSQL and Redis of the scale-out profile, run on loopback from this machine's binaries.

`infra/scale-out up|status|down` and the tests' fixture use these. Each service lives in a state
folder (`home`: data, logs, pid files; an ignored folder) and is bound to 127.0.0.1. Credentials
are generated on the first start and kept in `secrets` (outside the repository, 0700/0600);
they are passed to the services through files and environment, never on a command line (which
`ps` shows) and never printed.

PostgreSQL refuses to run as root: when we are root, its data folder belongs to the `postgres`
system user and its commands run through `runuser`.
"""

from __future__ import annotations

import json
import os
import secrets as _secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_PORTS = {"postgres": 5433, "redis": 6380, "spark": 7078, "spark_worker": 7079, "spark_worker2": 7081,
                 "spark_ui": 7080, "mlflow": 5055, "rdzv": 29410, "airflow": 8089,
                 "prometheus": 9091}  # not 9090: a system-wide Prometheus may hold that one
DATABASES = {"airflow": "lattice_airflow", "mlflow": "lattice_mlflow", "feast": "lattice_feast"}
PG_USER = "lattice"


class ServiceError(RuntimeError):
    """A service that could not be installed, started, reached or stopped."""


@dataclass(frozen=True)
class Layout:
    home: Path  # data, logs, pid files (an ignored folder: <repo>/.lattice/scale-out by default)
    secrets: Path  # credentials.json, profile.json, redis.conf (outside the repository)
    ports: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_PORTS))

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def profile_file(self) -> Path:
        return self.secrets / "profile.json"


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def credentials(layout: Layout) -> dict[str, str]:
    """The services' passwords, generated on first use (hex: safe in URLs and Feast's strings)."""
    path = _private_dir(layout.secrets) / "credentials.json"
    if path.exists():
        return json.loads(path.read_text())
    # a letter first: Feast JSON-decodes connection-string values, and an all-digit hex string
    # (or one like 12e45...) would become a number there
    creds = {"postgres": "p" + _secrets.token_hex(16), "redis": "r" + _secrets.token_hex(16)}
    _write_private(path, json.dumps(creds))
    return creds


# ---------------------------------------------------------------- PostgreSQL
def _pg_bin(name: str) -> str:
    # Debian keeps the server binaries in a versioned folder off PATH; take the newest
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / name).exists():
            return str(d / name)
    found = shutil.which(name)
    if not found:
        raise ServiceError(f"PostgreSQL's {name} was not found: install Debian's `postgresql` package "
                           f"(infra/setup.sh does) and run again")
    return found


def _as_pg_user(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _pg_dirs(layout: Layout) -> tuple[Path, Path]:
    root = layout.home / "postgres"
    return root / "data", root  # data folder, socket folder


def _chown_pg(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")


def start_postgres(layout: Layout) -> None:
    data, sock = _pg_dirs(layout)
    password = credentials(layout)["postgres"]
    layout.logs.mkdir(parents=True, exist_ok=True)
    log = layout.logs / "postgres.log"
    if not log.exists():
        log.touch()
    _chown_pg(log)
    if not (data / "PG_VERSION").exists():
        sock.mkdir(parents=True, exist_ok=True)
        os.chmod(sock, 0o700)
        _chown_pg(sock)
        pwfile = sock / ".pw"
        _write_private(pwfile, password + "\n")
        _chown_pg(pwfile)
        try:
            r = subprocess.run(_as_pg_user([_pg_bin("initdb"), "-D", str(data), "-U", PG_USER, "--auth=scram-sha-256",
                                            f"--pwfile={pwfile}", "-E", "UTF8", "--no-instructions"]),
                               capture_output=True, text=True)
        finally:
            pwfile.unlink(missing_ok=True)
        if r.returncode:
            raise ServiceError(f"initdb failed (exit {r.returncode}): {r.stderr.strip()[-800:]}")
    if postgres_ready(layout):
        return
    opts = f"-p {layout.ports['postgres']} -h 127.0.0.1 -k {sock}"
    r = subprocess.run(_as_pg_user([_pg_bin("pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60", "-o", opts, "start"]),
                       capture_output=True, text=True)
    if r.returncode:
        raise ServiceError(f"PostgreSQL did not start (exit {r.returncode}); see {log}: {r.stderr.strip()[-400:]}")
    _create_databases(layout, password)


def _connect(layout: Layout, dbname: str = "postgres", timeout: int = 5):
    import psycopg2

    return psycopg2.connect(host="127.0.0.1", port=layout.ports["postgres"], user=PG_USER,
                            password=credentials(layout)["postgres"], dbname=dbname, connect_timeout=timeout)


def _create_databases(layout: Layout, password: str) -> None:
    conn = _connect(layout)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT datname FROM pg_database")
        have = {r[0] for r in cur.fetchall()}
        for db in DATABASES.values():
            if db not in have:
                cur.execute(f'CREATE DATABASE "{db}"')
    conn.close()


def postgres_ready(layout: Layout) -> bool:
    try:
        _connect(layout, timeout=2).close()
        return True
    except Exception:
        return False


def stop_postgres(layout: Layout) -> None:
    data, _ = _pg_dirs(layout)
    if (data / "postmaster.pid").exists():
        subprocess.run(_as_pg_user([_pg_bin("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "60", "stop"]),
                       capture_output=True, text=True)


# ---------------------------------------------------------------- Redis
def _redis_client(layout: Layout, timeout: float = 2.0):
    import redis

    return redis.Redis(host="127.0.0.1", port=layout.ports["redis"], password=credentials(layout)["redis"],
                       socket_timeout=timeout, socket_connect_timeout=timeout)


def start_redis(layout: Layout) -> None:
    if redis_ready(layout):
        return
    exe = shutil.which("redis-server")
    if not exe:
        raise ServiceError("redis-server was not found: install Debian's `redis-server` package (infra/setup.sh does)")
    data = layout.home / "redis"
    data.mkdir(parents=True, exist_ok=True)
    layout.logs.mkdir(parents=True, exist_ok=True)
    conf = _private_dir(layout.secrets) / "redis.conf"  # holds requirepass: outside the repository
    _write_private(conf, "\n".join([
        "bind 127.0.0.1", "protected-mode yes", f"port {layout.ports['redis']}",
        f"requirepass {credentials(layout)['redis']}", "daemonize yes", f"dir {data}",
        f"pidfile {data / 'redis.pid'}", f"logfile {layout.logs / 'redis.log'}",
        'save ""', "appendonly no", ""]))
    r = subprocess.run([exe, str(conf)], capture_output=True, text=True)
    if r.returncode:
        raise ServiceError(f"redis-server did not start (exit {r.returncode}); see {layout.logs / 'redis.log'}")
    _wait(lambda: redis_ready(layout), 30, "Redis", layout.logs / "redis.log")


def redis_ready(layout: Layout) -> bool:
    try:
        return bool(_redis_client(layout).ping())
    except Exception:
        return False


def stop_redis(layout: Layout) -> None:
    try:
        _redis_client(layout).shutdown(nosave=True)
    except Exception:
        pass  # not running, or it closed the connection while shutting down (its normal answer)
    pid = layout.home / "redis" / "redis.pid"
    deadline = time.monotonic() + 20
    while pid.exists() and redis_ready(layout) and time.monotonic() < deadline:
        time.sleep(0.2)


def _wait(check, seconds: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.25)
    raise ServiceError(f"{what} did not answer within {seconds:.0f} s; see {log}")


def throwaway_layout(prefix: str = "lattice-so-") -> Layout:
    """A layout in fresh temporary folders on free loopback ports (tests and try-outs)."""
    import socket
    import tempfile

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    home = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(home, 0o755)  # PostgreSQL's own user (we may be root) must reach its data folder
    return Layout(home=home, secrets=Path(tempfile.mkdtemp(prefix=f"{prefix}secrets-")),
                  ports={name: free_port() for name in DEFAULT_PORTS})


# ---------------------------------------------------------------- the profile these services make
def profile_dict(layout: Layout) -> dict:
    """The scale-out profile (lattice.deploy.profile) for the services of this layout."""
    creds = credentials(layout)
    return {
        "spark": {"master": f"spark://127.0.0.1:{layout.ports['spark']}"},
        "postgres": {"host": "127.0.0.1", "port": layout.ports["postgres"], "user": PG_USER,
                     "password": creds["postgres"], "databases": dict(DATABASES)},
        "redis": {"host": "127.0.0.1", "port": layout.ports["redis"], "password": creds["redis"]},
        "mlflow": {"tracking_uri": f"http://127.0.0.1:{layout.ports['mlflow']}",
                   "artifacts": str(layout.home / "mlflow-artifacts")},
        "airflow": {"executor": "CeleryExecutor", "celery_workers": 2},
        "torchrun": {"nnodes": 2, "nproc_per_node": 1, "rdzv_endpoint": f"127.0.0.1:{layout.ports['rdzv']}",
                     "local_nodes": True},
        "serving": {"workers": 2},
        # `lattice serve` writes its scrape target into targets_dir (lattice/serving/scrape_target.py)
        "prometheus": {"url": f"http://127.0.0.1:{layout.ports['prometheus']}",
                       "targets_dir": str(layout.home / "prometheus" / "targets")},
    }
