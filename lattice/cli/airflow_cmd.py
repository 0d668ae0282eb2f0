"""`lattice airflow [--profile embedded|scale-out] [--port 8080] [--status] [--stop]`: run the
Airflow UI with one DAG family per config.

`embedded` (the default) runs `airflow standalone` on SQLite. `scale-out` runs each Airflow
component on the services of the scale-out profile file (`--profile-file`, else
$LATTICE_PROFILE_FILE, else ~/.lattice/scale-out/profile.json): PostgreSQL metadata DB, the
profile's executor (Celery workers on Redis, or LocalExecutor) and users with roles. Passwords are
never printed: the command says which owner-only file holds them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _profile_file(args: argparse.Namespace) -> Path:
    from lattice.config.schema import Deployment

    return Path(args.profile_file or os.environ.get("LATTICE_PROFILE_FILE") or Deployment().profile_file).expanduser()


def _homes(args: argparse.Namespace) -> tuple[Path, Path]:
    from lattice.orchestration import standalone

    if args.home:
        return Path(args.home).resolve(), Path(args.home).resolve()
    return standalone.default_home(), standalone.default_home().with_name("airflow-scale-out")


def _scale_out(args: argparse.Namespace, home: Path) -> int:
    from lattice.deploy.profile import ProfileError, read_profile, redact
    from lattice.orchestration import scaleout_airflow

    if args.status:
        print(json.dumps(scaleout_airflow.status(home), indent=2))
        return 0
    try:
        svc = read_profile(_profile_file(args))
    except ProfileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"starting airflow ({svc.airflow_executor}, metadata DB on PostgreSQL) from {home}; logs in {home / 'logs'}",
          file=sys.stderr)
    try:
        af = scaleout_airflow.start(svc, home, port=_port(args), host=args.host,
                                    configs_dir=Path(args.configs) if args.configs else None, timeout=args.timeout)
    except (RuntimeError, TimeoutError, ValueError) as exc:
        print(f"error: {redact(exc)}", file=sys.stderr)
        return 1
    print(f"Airflow UI: {af.url}  ({af.executor}, {sum(n.startswith('worker') for n in af.pids)} Celery workers)\n"
          f"users: admin (admin), operator (op: triggers DAGs), viewer (viewer: read-only); "
          f"their passwords are in {af.users_file} (owner-only)\n"
          "Stop with `lattice airflow --profile scale-out --stop`.")
    return 0


def _port(args: argparse.Namespace) -> int:
    from lattice.orchestration import standalone

    port = standalone.pick_port(args.port, args.host)
    if port != args.port:
        print(f"port {args.port} is busy; using {port}", file=sys.stderr)
    return port


def _airflow(args: argparse.Namespace) -> int:
    from lattice.orchestration import scaleout_airflow, standalone

    embedded_home, scale_out_home = _homes(args)
    if args.stop:
        sa = standalone.stop(embedded_home)
        so = scaleout_airflow.stop(scale_out_home)
        if sa:
            print(f"stopped airflow standalone (pid {sa.pid}, {sa.url})")
        if so["stopped"]:
            print(f"stopped scale-out airflow ({', '.join(so['stopped'])})")
        if not sa and not so["stopped"]:
            where = embedded_home if embedded_home == scale_out_home else f"{embedded_home} or {scale_out_home}"
            print(f"no airflow standalone started from {where} (nor a scale-out airflow)")
        return 0
    if args.profile == "scale-out":
        return _scale_out(args, scale_out_home)
    if (sa := standalone.running(embedded_home)) is not None:
        print(f"airflow already runs at {sa.url}  login: admin, password in {sa.passwords_file}  "
              "(stop: lattice airflow --stop)")
        return 0
    if args.status:
        print(f"no airflow standalone runs from {embedded_home}")
        return 0
    port = _port(args)
    sa = standalone.start(embedded_home, port=port, host=args.host,
                          configs_dir=Path(args.configs) if args.configs else None)
    print(f"starting airflow standalone (pid {sa.pid}); AIRFLOW_HOME={embedded_home}; log {sa.log_file}")
    shown = {"last": ""}

    def progress(state: str) -> None:
        if state != shown["last"]:
            print(f"  waiting: {state}", file=sys.stderr)
            shown["last"] = state

    try:
        standalone.wait_ready(sa, timeout=args.timeout, progress=progress)
    except (RuntimeError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        standalone.stop(embedded_home)
        return 1
    print(f"Airflow UI: {sa.url}\nlogin: admin; the password is in {sa.passwords_file} (owner-only)\n"
          "DAGs start paused: unpause one in the UI or trigger it with parameters. Stop with `lattice airflow --stop`.")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("airflow", help="start (or --stop) a local Airflow UI running the DAGs of every config")
    p.add_argument("--profile", choices=("embedded", "scale-out"), default="embedded",
                   help="embedded: airflow standalone on SQLite; scale-out: PostgreSQL, the profile's executor, users with roles")
    p.add_argument("--profile-file", help="scale-out profile (default: $LATTICE_PROFILE_FILE or ~/.lattice/scale-out/profile.json)")
    p.add_argument("--port", type=int, default=8080, help="UI and REST API port (a free one is used if it is busy)")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    p.add_argument("--status", action="store_true", help="say what runs (scale-out: every component and its health)")
    p.add_argument("--stop", action="store_true", help="stop the Airflow this command started (either profile)")
    p.add_argument("--home", help="AIRFLOW_HOME (default: .lattice/airflow, or .lattice/airflow-scale-out)")
    p.add_argument("--configs", help="folder of platform configs to build DAGs from (default: configs/)")
    p.add_argument("--timeout", type=float, default=300, help="seconds to wait for Airflow to become ready")
    p.set_defaults(func=_airflow)
