"""`lattice config check FILE`."""

from __future__ import annotations

import argparse
import sys

from lattice.config import ConfigError, load_config
from lattice.config.summary import render_summary


def _check(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file)
    except ConfigError as exc:
        print(f"{len(exc.problems)} problem(s) in {exc.file}:", file=sys.stderr)
        for p in exc.problems:
            print("  " + p.render(exc.file), file=sys.stderr)
        return 1
    print(render_summary(config))
    print("\nOK")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="check a platform config")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    check = csub.add_parser("check", help="validate a config and print its domain × objective summary")
    check.add_argument("file", help="platform config YAML, e.g. configs/demo.yaml")
    check.set_defaults(func=_check)
