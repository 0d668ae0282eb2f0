"""`lattice airflow [--port 8080] [--stop]`: run the Airflow UI with one DAG family per config."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _airflow(args: argparse.Namespace) -> int:
    from lattice.orchestration import standalone

    home = Path(args.home).resolve() if args.home else standalone.default_home()
    if args.stop:
        sa = standalone.stop(home)
        print(f"stopped airflow standalone (pid {sa.pid}, {sa.url})" if sa else f"no airflow standalone started from {home}")
        return 0
    if (sa := standalone.running(home)) is not None:
        user, password = sa.credentials()
        print(f"airflow already runs at {sa.url}  login: {user} / {password}  (stop: lattice airflow --stop)")
        return 0
    port = standalone.pick_port(args.port, args.host)
    if port != args.port:
        print(f"port {args.port} is busy; using {port}", file=sys.stderr)
    sa = standalone.start(home, port=port, host=args.host, configs_dir=Path(args.configs) if args.configs else None)
    print(f"starting airflow standalone (pid {sa.pid}); AIRFLOW_HOME={home}; log {sa.log_file}")
    shown = {"last": ""}

    def progress(state: str) -> None:
        if state != shown["last"]:
            print(f"  waiting: {state}", file=sys.stderr)
            shown["last"] = state

    try:
        standalone.wait_ready(sa, timeout=args.timeout, progress=progress)
    except (RuntimeError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        standalone.stop(home)
        return 1
    user, password = sa.credentials()
    print(f"Airflow UI: {sa.url}\nlogin: {user} / {password}\n"
          "DAGs start paused: unpause one in the UI or trigger it with parameters. Stop with `lattice airflow --stop`.")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("airflow", help="start (or --stop) a local Airflow UI running the DAGs of every config")
    p.add_argument("--port", type=int, default=8080, help="UI and REST API port (a free one is used if it is busy)")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    p.add_argument("--stop", action="store_true", help="stop the Airflow this command started")
    p.add_argument("--home", help="AIRFLOW_HOME (default: .lattice/airflow in the project)")
    p.add_argument("--configs", help="folder of platform configs to build DAGs from (default: configs/)")
    p.add_argument("--timeout", type=float, default=300, help="seconds to wait for Airflow to become ready")
    p.set_defaults(func=_airflow)
