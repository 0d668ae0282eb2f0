"""`infra/scale-out up|status|down`: the scale-out profile's services on this machine, on loopback.

    up      install missing Debian packages, start every service (idempotent), health-check, write the profile
    status  each service, its endpoint (passwords redacted) and health; exit 1 if one is down
    down    stop every service; exit 1 if a process started from the state folder survives

State (data, logs, pid files): LATTICE_SCALEOUT_HOME, default <repo>/.lattice/scale-out (ignored).
Secrets (credentials, redis.conf, profile.json): LATTICE_SCALEOUT_SECRETS, default ~/.lattice/scale-out.
Ports: DEFAULT_PORTS, overridden by `--port name=N` or LATTICE_SCALEOUT_PORTS="name=N,..." on the
first `up`; they are remembered in the state folder so `status` and `down` find the services.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lattice.deploy import local_services as ls
from lattice.deploy import mlflow_server as ml
from lattice.deploy import prometheus_server as prom
from lattice.deploy import spark_cluster as sc
from lattice.deploy.profile import redact, write_profile

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Part:
    name: str
    start: Callable[[ls.Layout], None]
    stop: Callable[[ls.Layout], None]
    ready: Callable[[ls.Layout], bool]
    endpoint: Callable[[ls.Layout], str]
    log: str  # file name under <home>/logs (a glob for several)


def _pg_endpoint(layout: ls.Layout) -> str:
    return redact(f"postgresql://{ls.PG_USER}:{ls.credentials(layout)['postgres']}@127.0.0.1:{layout.ports['postgres']}"
                  f" (databases {', '.join(ls.DATABASES.values())})")


def _redis_endpoint(layout: ls.Layout) -> str:
    return redact(f"redis://:{ls.credentials(layout)['redis']}@127.0.0.1:{layout.ports['redis']}")


def parts() -> list[Part]:
    """Every service in start order (stopped in reverse)."""
    return [
        Part("postgres", ls.start_postgres, ls.stop_postgres, ls.postgres_ready, _pg_endpoint, "postgres.log"),
        Part("redis", ls.start_redis, ls.stop_redis, ls.redis_ready, _redis_endpoint, "redis.log"),
        Part("spark", sc.start_spark, sc.stop_spark, sc.spark_ready,
             lambda l: f"{sc.master_url(l)} ({sc.alive_workers(l)}/{sc.WORKERS} workers; UI http://127.0.0.1:{l.ports['spark_ui']})",
             "spark-*.log"),
        Part("mlflow", ml.start_mlflow, ml.stop_mlflow, ml.mlflow_ready,
             lambda l: f"{ml.tracking_uri(l)} (artifacts {ml.artifacts_dir(l)})", "mlflow.log"),
        Part("prometheus", prom.start_prometheus, prom.stop_prometheus, prom.prometheus_ready,
             lambda l: f"{prom.url(l)} (scrape targets in {prom.targets_dir(l)})", "prometheus.log"),
    ]


def _airflow_home(layout: ls.Layout) -> Path:
    return layout.home / "airflow"


def _airflow_start(layout: ls.Layout) -> None:
    from lattice.deploy.profile import read_profile
    from lattice.orchestration import scaleout_airflow as af

    af.start(read_profile(layout.profile_file), _airflow_home(layout), port=layout.ports["airflow"])


def _airflow_stop(layout: ls.Layout) -> None:
    from lattice.orchestration import scaleout_airflow as af

    af.stop(_airflow_home(layout))


def _airflow_ready(layout: ls.Layout) -> bool:
    from lattice.orchestration import scaleout_airflow as af

    return af.ready(_airflow_home(layout))


def profile_parts() -> list[Part]:
    """Parts started after the profile file is written, because they read it (`services(config)`):
    Airflow (metadata DB on the PostgreSQL above, CeleryExecutor with its broker on the Redis above).
    `LATTICE_SCALEOUT_PARTS=postgres,redis,...` leaves out the parts it does not name."""
    return [Part("airflow", _airflow_start, _airflow_stop, _airflow_ready,
                 lambda l: f"http://127.0.0.1:{l.ports['airflow']} (users in {l.secrets})", "../airflow/logs/*.log")]


def selected(all_parts: list[Part]) -> list[Part]:
    wanted = [p for p in os.environ.get("LATTICE_SCALEOUT_PARTS", "").split(",") if p]
    unknown = set(wanted) - {p.name for p in parts() + profile_parts()}
    if unknown:
        raise SystemExit(f"scale-out: LATTICE_SCALEOUT_PARTS names unknown parts {sorted(unknown)}; "
                         f"known: {[p.name for p in parts() + profile_parts()]}")
    return [p for p in all_parts if not wanted or p.name in wanted]


# ------------------------------------------------------------------ layout
def _parse_ports(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in ls.DEFAULT_PORTS or not value.isdigit():
            raise SystemExit(f"scale-out: bad port {item!r}: use name=N with name one of {sorted(ls.DEFAULT_PORTS)}")
        out[name] = int(value)
    return out


def layout_from_env(port_overrides: list[str] | None = None) -> ls.Layout:
    home = Path(os.environ.get("LATTICE_SCALEOUT_HOME") or REPO / ".lattice" / "scale-out").expanduser().resolve()
    secrets = Path(os.environ.get("LATTICE_SCALEOUT_SECRETS") or "~/.lattice/scale-out").expanduser().resolve()
    saved = home / "ports.json"
    ports = dict(ls.DEFAULT_PORTS)
    if saved.exists():
        ports.update(json.loads(saved.read_text()))
    env_ports = [p for p in os.environ.get("LATTICE_SCALEOUT_PORTS", "").split(",") if p]
    ports.update(_parse_ports(env_ports + (port_overrides or [])))
    return ls.Layout(home=home, secrets=secrets, ports=ports)


def _prepare_home(layout: ls.Layout) -> None:
    layout.logs.mkdir(parents=True, exist_ok=True)
    # PostgreSQL runs as its own user when we are root: it must be able to enter the state folder
    os.chmod(layout.home, 0o755)
    for d in layout.home.parents:
        if d.stat().st_mode & 0o001:
            break
        if d.is_relative_to(REPO):  # only folders of this checkout; anything above is the user's choice
            os.chmod(d, d.stat().st_mode | 0o111)
    (layout.home / "ports.json").write_text(json.dumps(layout.ports, indent=1))


# ------------------------------------------------------------------ packages
def ensure_packages() -> None:
    """Debian's postgresql, redis-server and prometheus, installed like infra/setup.sh does if missing."""
    have_pg = any(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if have_pg and shutil.which("redis-server") and shutil.which("prometheus"):
        return
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    print("scale-out: installing postgresql + redis-server + prometheus (Debian)", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "postgresql", "redis-server", "prometheus"]):
        if subprocess.run(sudo + cmd, env=env, stdout=subprocess.DEVNULL).returncode:
            raise ls.ServiceError("apt-get could not install postgresql/redis-server/prometheus: install them by hand "
                                  "and run again")
    # the packages start system-wide instances on the default ports; ours run on other ports
    for svc in ("redis-server", "postgresql", "prometheus"):
        subprocess.run(sudo + ["service", svc, "stop"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# ------------------------------------------------------------------ commands
def up(layout: ls.Layout) -> int:
    ensure_packages()
    _prepare_home(layout)
    for part in selected(parts()):
        print(f"scale-out: starting {part.name} ...", flush=True)
        part.start(layout)
    write_profile(layout.profile_file, ls.profile_dict(layout))
    print(f"scale-out: profile written to {layout.profile_file} (mode 0600)")
    for part in selected(profile_parts()):
        print(f"scale-out: starting {part.name} ...", flush=True)
        part.start(layout)
    return status(layout)


def status(layout: ls.Layout) -> int:
    down = 0
    for part in selected(parts() + profile_parts()):
        ok = part.ready(layout)
        down += not ok
        print(f"{part.name:<9} {'up' if ok else 'DOWN':<5} {part.endpoint(layout)}   logs: {layout.logs / part.log}")
    print(f"profile   {'present' if layout.profile_file.exists() else 'missing'}  {layout.profile_file}")
    return 1 if down else 0


def leftovers(layout: ls.Layout) -> list:
    """Processes still running from the state folder (its path in their command line or cwd)."""
    import psutil

    home = str(layout.home)
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "cwd"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if home in cmd or (p.info["cwd"] or "").startswith(home):
                found.append(p)
        except psutil.Error:
            continue
    return found


def down(layout: ls.Layout) -> int:
    for part in reversed(selected(parts() + profile_parts())):
        print(f"scale-out: stopping {part.name}", flush=True)
        part.stop(layout)
    left = leftovers(layout)
    for p in left:
        print(f"scale-out: still running from {layout.home}: pid {p.pid} {redact(' '.join(p.info['cmdline'] or []))[:120]}",
              file=sys.stderr)
    return 1 if left else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="infra/scale-out", description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["up", "status", "down"])
    ap.add_argument("--port", action="append", default=[], metavar="NAME=N",
                    help=f"override a port on the first `up` (names: {', '.join(ls.DEFAULT_PORTS)})")
    args = ap.parse_args(argv)
    layout = layout_from_env(args.port)
    try:
        return {"up": up, "status": status, "down": down}[args.command](layout)
    except ls.ServiceError as e:
        print(f"scale-out: {redact(str(e))}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
