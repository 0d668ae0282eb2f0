"""`lattice distill CONFIG`: teacher scores -> student -> evaluation -> export -> registry."""

from __future__ import annotations

import argparse
import json

from lattice.cli.common import add_set_argument, config_and_paths


def _distill(args: argparse.Namespace) -> int:
    from lattice.distill.stages import distill

    config, paths = config_and_paths(args, ensure=True)
    summary = distill(config, paths, nproc=args.nproc, epochs=args.epochs, end=args.end)
    print(json.dumps(summary, indent=2, default=str))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("distill", help="distill the trained teacher into the student, export it and register it as challenger")
    p.add_argument("config", help="platform config YAML, e.g. configs/demo.yaml")
    p.add_argument("--workdir", default=None, help="work directory (default: the config's workdir)")
    p.add_argument("--nproc", type=int, default=None, help="training processes (default: training.nproc)")
    p.add_argument("--epochs", type=int, default=None, help="student epochs (default: training.epochs)")
    p.add_argument("--end", default=None, metavar="YYYY-MM-DD",
                   help="with training.window: the interval end of the student's window (default: the teacher's)")
    add_set_argument(p)
    p.set_defaults(func=_distill)
