"""`lattice promote CONFIG [--dry-run]` and `lattice rollback CONFIG`."""

from __future__ import annotations

import argparse
import json
import sys

from lattice.cli.common import load_or_exit


def _paths(args: argparse.Namespace):
    from lattice.paths import Paths

    config = load_or_exit(args.config)
    return config, Paths.for_config(config, args.workdir).ensure()


def _promote(args: argparse.Namespace) -> int:
    from lattice.promotion.stages import promote

    from lattice.export.window import DayNotInTable

    config, paths = _paths(args)
    try:
        out = promote(config, paths, dry_run=args.dry_run)
    except DayNotInTable as exc:  # not a rejection: the challenger is judged once its next day arrives
        print(f"promote: waiting: {exc}")
        return 4
    except (LookupError, ValueError, FileNotFoundError, RuntimeError) as exc:
        # a missing registry, no challenger, a promotion undone after a failed write: one line, exit 1
        print(f"promote: {exc}", file=sys.stderr)
        return 1
    for r in out["reasons"]:
        print(("  ok    " if r["passed"] else "  FAIL  ") + r["message"])
    print(f"decision: {out['decision']} (challenger v{out['challenger_version']}, champion before: {out['champion_before']}, "
          f"after: {out['champion_after']}){' [dry run]' if args.dry_run else ''}")
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    return 0 if out["passed"] else 2


def _rollback(args: argparse.Namespace) -> int:
    from lattice.promotion.stages import rollback

    config, paths = _paths(args)
    try:
        out = rollback(config, paths)
    except (LookupError, ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"rollback: {exc}", file=sys.stderr)
        return 1
    if out.get("reconciled"):
        print(f"first {out['reconciled']}")
    print(f"champion rolled back from v{out['from_version']} to v{out['to_version']}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("promote", help="gate the challenger against the champion; move the champion alias if it passes")
    p.add_argument("config", help="platform config YAML, e.g. configs/demo.yaml")
    p.add_argument("--workdir", default=None, help="work directory (default: the config's workdir)")
    p.add_argument("--dry-run", action="store_true", help="evaluate and record the decision, but do not move the alias")
    p.add_argument("--json", action="store_true", help="also print the full decision as JSON")
    p.set_defaults(func=_promote)
    r = sub.add_parser("rollback", help="return the champion alias to the previous champion")
    r.add_argument("config", help="platform config YAML, e.g. configs/demo.yaml")
    r.add_argument("--workdir", default=None, help="work directory (default: the config's workdir)")
    r.set_defaults(func=_rollback)
