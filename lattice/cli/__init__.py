"""The `lattice` command line. Each command lives in its own module with `register(subparsers)`;
only commands that work are listed here."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ["config_cmd", "synth_cmd", "features_cmd", "hashing_cmd", "train_cmd", "evaluate_cmd", "airflow_cmd", "distill_cmd", "promote_cmd", "serve_cmd", "predict_cmd", "monitor_cmd", "demo_cmd", "fp8_cmd", "tune_cmd"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lattice",
        description="Lattice: multi-domain, multi-objective ads ranking, from raw logs to a served model.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"lattice.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from lattice.quiet import library_notices

    library_notices()  # before the commands import torchrec and fbgemm, which warn at import
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
