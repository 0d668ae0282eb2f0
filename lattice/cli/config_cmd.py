"""`lattice config check FILE` and `lattice config reference [--output FILE]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lattice.config import ConfigError, Problem, load_config
from lattice.config.summary import render_summary


def _report(file: str, problems: list[Problem]) -> None:
    print(f"{len(problems)} problem(s) in {file}:", file=sys.stderr)
    for p in problems:
        print("  " + p.render(file), file=sys.stderr)


def _check(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file)
    except ConfigError as exc:
        _report(exc.file, exc.problems)
        return 1
    print(render_summary(config))
    from lattice.config.notes import speed_notes

    for note in speed_notes(config):
        print(f"note: {note}")
    if not args.no_data:
        # the data checks run after the config is valid: they read paths and formats from it
        from lattice.config.datacheck import data_problems

        notes: list[str] = []
        problems = data_problems(config, notes)
        for note in notes:
            print(f"note: {note}")
        if problems:
            print()
            _report(args.file, problems)
            return 1
    print("\nOK")
    return 0


def _reference(args: argparse.Namespace) -> int:
    from lattice.config.reference import render_reference

    text = render_reference()
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="check a platform config, or print the config reference")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    check = csub.add_parser("check", help="validate a config, check it against its data and print its "
                                          "domain × objective summary")
    check.add_argument("file", help="platform config YAML, e.g. configs/demo.yaml")
    check.add_argument("--no-data", action="store_true",
                       help="validate the config only; skip reading the source files (paths, columns, time formats)")
    check.set_defaults(func=_check)
    ref = csub.add_parser("reference", help="print the Markdown reference of every config key (from the schema's docstrings)")
    ref.add_argument("--output", default=None, help="write it to this file instead of stdout, e.g. docs/config-reference.md")
    ref.set_defaults(func=_reference)
