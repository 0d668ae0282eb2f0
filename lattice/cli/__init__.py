"""The `lattice` command line. Each command lives in its own module with `register(subparsers)`;
only commands that work are listed here."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ["config_cmd", "synth_cmd", "features_cmd", "hashing_cmd", "trees_cmd", "train_cmd", "evaluate_cmd", "airflow_cmd", "distill_cmd",
            "promote_cmd", "serve_cmd", "predict_cmd", "monitor_cmd", "demo_cmd", "run_cmd", "fp8_cmd", "tune_cmd"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lattice",
        description="Lattice: multi-domain, multi-objective ads ranking, from raw logs to a served model.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"lattice.cli.{name}").register(sub)
    return parser


def log_to_pipe(stream=None) -> bool:
    """Where stderr is a file or a pipe (a redirected run, CI, a job scheduler), the platform's INFO
    lines go there: the ranks' relayed progress lines and the stages' logs are INFO, and without a
    handler Python's last resort shows WARNING and up only, so a redirected 2-rank `lattice train`
    printed nothing for minutes (issue 40). A terminal keeps tqdm's bars and no extra lines."""
    import logging

    from lattice.progress import is_terminal

    stream = sys.stderr if stream is None else stream
    if is_terminal(stream) or logging.getLogger().handlers:
        return False  # a terminal, or someone (Airflow, pytest's caplog setup, a user) configured logging
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    for name in ("lattice", "pipelines"):
        logger = logging.getLogger(name)
        if not any(getattr(h, "_lattice_pipe", False) for h in logger.handlers):
            handler._lattice_pipe = True  # type: ignore[attr-defined]
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
            # a library that calls logging.basicConfig later (at import) would print each line twice
            logger.propagate = False
    return True


def main(argv: list[str] | None = None) -> int:
    from lattice.quiet import library_notices

    library_notices()  # before the commands import torchrec and fbgemm, which warn at import
    args = build_parser().parse_args(argv)
    log_to_pipe()
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
