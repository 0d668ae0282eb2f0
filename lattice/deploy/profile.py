"""The deployment profile: which engines a config's stages use, resolved into one `Services` value.

`deployment.profile: embedded` (the default) keeps everything on this machine in files.
`deployment.profile: scale-out` reads a JSON profile file (written by `infra/scale-out up`, or by
an operator for a real cluster) that names PostgreSQL, Redis, a Spark master, an MLflow server and
the torchrun rendezvous. Every consumer (Spark session, Feast repo, MLflow client, Airflow
environment, training launcher, server) asks `services(config)` and never reads the file itself,
so the same DAG code and configs run on both.

The file holds credentials: it must be owner-only (0600) and lives outside the repository.
Nothing here prints a URL with its password; use `redact` for logs and errors.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from lattice.config import PlatformConfig

PROFILE_VERSION = 1
EMBEDDED_SPARK_MASTER = "local[2]"


class ProfileError(ValueError):
    """A scale-out profile that is missing, unreadable, too open or incomplete."""


@dataclass(frozen=True)
class Postgres:
    host: str
    port: int
    user: str
    password: str
    databases: dict[str, str]  # role -> database name: airflow, mlflow, feast, celery

    def url(self, role: str, driver: str = "postgresql+psycopg2") -> str:
        if role not in self.databases:
            raise ProfileError(f"the profile's postgres.databases has no {role!r} database "
                               f"(has {sorted(self.databases)}); run `infra/scale-out up` again")
        return (f"{driver}://{quote(self.user, safe='')}:{quote(self.password, safe='')}"
                f"@{self.host}:{self.port}/{self.databases[role]}")


@dataclass(frozen=True)
class RedisEndpoint:
    host: str
    port: int
    password: str

    def url(self, db: int = 0) -> str:
        """redis:// URL (Celery's broker, redis-py)."""
        return f"redis://:{quote(self.password, safe='')}@{self.host}:{self.port}/{db}"

    def feast_connection_string(self, db: int = 0) -> str:
        """Feast's `connection_string` format: host:port,password=...,db=N."""
        return f"{self.host}:{self.port},password={self.password},db={db}"


@dataclass(frozen=True)
class Torchrun:
    nnodes: int = 1
    nproc_per_node: int | None = None  # None: the config's training.nproc
    rdzv_endpoint: str | None = None  # host:port of the c10d rendezvous; None: a free loopback port
    local_nodes: bool = False  # start every node's torchrun on this machine (loopback "nodes")


@dataclass(frozen=True)
class Services:
    """Endpoints for one config. A None field means: the embedded default of that part."""

    profile: str = "embedded"
    spark_master: str = EMBEDDED_SPARK_MASTER
    postgres: Postgres | None = None
    redis: RedisEndpoint | None = None
    mlflow_tracking_uri: str | None = None
    mlflow_artifacts: str | None = None
    airflow_executor: str = "LocalExecutor"
    celery_workers: int = 0
    torchrun: Torchrun = field(default_factory=Torchrun)
    serving_workers: int = 1
    prometheus_url: str | None = None
    prometheus_targets_dir: str | None = None  # file_sd folder: each `lattice serve` adds its target there
    source: Path | None = None  # the profile file read (None: embedded)

    @property
    def scale_out(self) -> bool:
        return self.profile == "scale-out"

    # ---- derived settings each consumer needs
    @property
    def airflow_sql_alchemy_conn(self) -> str | None:
        return self.postgres.url("airflow") if self.postgres else None

    @property
    def celery_broker_url(self) -> str | None:
        return self.redis.url(db=1) if self.redis else None

    @property
    def celery_result_backend(self) -> str | None:
        return self.postgres.url("airflow", driver="db+postgresql+psycopg2") if self.postgres else None

    @property
    def feast_online_store(self) -> dict | None:
        return {"type": "redis", "connection_string": self.redis.feast_connection_string(db=0)} if self.redis else None

    @property
    def feast_registry(self) -> dict | None:
        if not self.postgres:
            return None
        return {"registry_type": "sql", "path": self.postgres.url("feast"), "cache_ttl_seconds": 60,
                "sqlalchemy_config_kwargs": {"echo": False, "pool_pre_ping": True}}


EMBEDDED = Services()

_SECRET_RE = re.compile(r"(://[^:/@\s]*:)([^@\s]+)(@)|(password=)([^,\s]+)")


def redact(text: str) -> str:
    """`text` with the password of every URL or connection string in it replaced by ***."""
    return _SECRET_RE.sub(lambda m: f"{m[1]}***{m[3]}" if m[1] else f"{m[4]}***", str(text))


def profile_path(config: PlatformConfig) -> Path:
    return Path(os.environ.get("LATTICE_PROFILE_FILE") or config.deployment.profile_file).expanduser()


def _require(d: dict, key: str, where: str, path: Path):
    if key not in d:
        raise ProfileError(f"{path}: `{where}{key}` is missing; run `infra/scale-out up` to rewrite the profile, "
                           f"or add it by hand")
    return d[key]


def read_profile(path: Path) -> Services:
    """Parse and check one profile file (see the module docstring)."""
    if not path.is_file():
        raise ProfileError(f"deployment.profile is scale-out but the profile file {path} does not exist: "
                           f"start the services with `infra/scale-out up` (it writes the file), or set "
                           f"deployment.profile_file / LATTICE_PROFILE_FILE to your cluster's profile")
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ProfileError(f"{path} holds credentials but is readable by others (mode {stat.filemode(mode)}): "
                           f"run `chmod 600 {path}`")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path} is not valid JSON ({e.msg} at line {e.lineno}); run `infra/scale-out up` "
                           f"to rewrite it") from None
    if raw.get("version") != PROFILE_VERSION:
        raise ProfileError(f"{path}: version {raw.get('version')!r}, this platform reads version {PROFILE_VERSION}")
    pg = raw.get("postgres")
    rd = raw.get("redis")
    tr = raw.get("torchrun") or {}
    af = raw.get("airflow") or {}
    return Services(
        profile="scale-out",
        spark_master=_require(raw.get("spark") or {}, "master", "spark.", path),
        postgres=Postgres(host=_require(pg, "host", "postgres.", path), port=int(_require(pg, "port", "postgres.", path)),
                          user=_require(pg, "user", "postgres.", path), password=_require(pg, "password", "postgres.", path),
                          databases=dict(_require(pg, "databases", "postgres.", path))) if pg else None,
        redis=RedisEndpoint(host=_require(rd, "host", "redis.", path), port=int(_require(rd, "port", "redis.", path)),
                            password=_require(rd, "password", "redis.", path)) if rd else None,
        mlflow_tracking_uri=(raw.get("mlflow") or {}).get("tracking_uri"),
        mlflow_artifacts=(raw.get("mlflow") or {}).get("artifacts"),
        airflow_executor=af.get("executor", "LocalExecutor"),
        celery_workers=int(af.get("celery_workers", 0)),
        torchrun=Torchrun(nnodes=int(tr.get("nnodes", 1)), nproc_per_node=tr.get("nproc_per_node"),
                          rdzv_endpoint=tr.get("rdzv_endpoint"), local_nodes=bool(tr.get("local_nodes", False))),
        serving_workers=int((raw.get("serving") or {}).get("workers", 1)),
        prometheus_url=(raw.get("prometheus") or {}).get("url"),
        prometheus_targets_dir=(raw.get("prometheus") or {}).get("targets_dir"),
        source=path,
    )


def services(config: PlatformConfig) -> Services:
    """The engines this config's stages use (`EMBEDDED` unless `deployment.profile: scale-out`).

    Resolved once per loaded config and kept on it: a run context (`task_runner.RunContext`, which
    the DAG tasks, the demo and `lattice run` build) resolves it before its first step, so every
    stage of the run reads the same engines (copies of the config, such as a domain subset, keep
    them) and none reads the profile file again, even if the file changes during the run."""
    bound = getattr(config, "_services", None)
    # a copy made with another `deployment` section (model_copy keeps private values) resolves anew
    if bound is not None and bound[0] == config.deployment:
        return bound[1]
    resolved = EMBEDDED if config.deployment.profile == "embedded" else read_profile(profile_path(config))
    bind(config, resolved)
    return resolved


def bind(config: PlatformConfig, svc: Services) -> PlatformConfig:
    """Give `config` the engines a run resolved (a config reloaded with a step's own `--set` keys
    keeps its run's engines); returns it."""
    config._services = (config.deployment, svc)
    return config


def write_profile(path: Path, profile: dict) -> None:
    """Write a profile file owner-only from the first byte (never world-readable, even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"version": PROFILE_VERSION, **profile}, f, indent=2)
    os.replace(tmp, path)
