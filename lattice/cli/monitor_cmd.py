"""`lattice monitor CONFIG [--start T --end T --period day|hour]`: the served model's per-cell
health from the prediction log and the labels that arrived (lattice.monitoring.stage)."""

from __future__ import annotations

import argparse
import json
import sys

from lattice.cli.common import add_set_argument, config_and_paths


def _monitor(args: argparse.Namespace) -> int:
    from lattice.monitoring.stage import monitor

    config, paths = config_and_paths(args)
    try:
        out = monitor(config, paths, start=args.start, end=args.end, period=args.period, mlflow=not args.no_mlflow)
    except ValueError as exc:
        print(f"lattice monitor: {exc}", file=sys.stderr)
        return 1
    brief = {k: v for k, v in out.items() if k not in ("cells", "drift")}
    brief["cells"], brief["drift"] = len(out["cells"]), len(out["drift"])
    print(json.dumps(brief, indent=1, default=str))
    for t in out["tripped"]:
        print(f"tripped: {t['kind']} in {t['domain']}/{t.get('objective') or t.get('feature')} "
              f"(model v{t['model_version']}): {t['reason']}", file=sys.stderr)
    for t in out["needs_person"]:
        print(f"needs a person: {t['kind']} in {t['domain']}/{t.get('objective') or t.get('feature')} still trips "
              f"after the retrain to v{t['model_version']}", file=sys.stderr)
    # exit 3 only when asked: a scheduler that should fail the task on a tripped rule
    return 3 if args.fail_on_trip and (out["tripped"] or out["needs_person"]) else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("monitor", help="per-cell online NE / calibration, drift and rules from the prediction log")
    p.add_argument("config", help="platform config YAML")
    p.add_argument("--start", default=None, help="first prediction time to read (UTC, e.g. 2026-01-05); default: all")
    p.add_argument("--end", default=None, help="end of the window, exclusive (UTC); default: all")
    p.add_argument("--period", default="day", choices=["day", "hour"], help="length of one period of the series")
    p.add_argument("--no-mlflow", action="store_true", help="do not log the series to MLflow")
    p.add_argument("--fail-on-trip", action="store_true", help="exit 3 when a rule tripped or needs a person")
    p.add_argument("--workdir", default=None, help="work directory (default: the config's)")
    add_set_argument(p)
    p.set_defaults(func=_monitor)
