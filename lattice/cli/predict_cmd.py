"""`lattice predict CONFIG --model champion|teacher|student --input PATH --output PATH`."""

from __future__ import annotations

import argparse
import json
import sys

from lattice.cli.common import add_set_argument, config_and_paths


def _predict(args: argparse.Namespace) -> int:
    from lattice.scoring.batch import predict_file
    from pipelines.score_input import InputError

    config, paths = config_and_paths(args)
    try:
        out = predict_file(config, paths, args.input, args.output, args.model, args.source,
                           log_predictions=False if args.no_log else None, logged_at=args.logged_at)
    except (InputError, LookupError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(out, indent=1))
    if out["quarantined"]:
        print(f"{out['quarantined']} of {out['rows_in']} rows quarantined {out['quarantine_reasons']}: see {out['quarantine']}",
              file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="score a csv / parquet file or folder with a model (batch scoring)")
    p.add_argument("config", help="platform config YAML")
    p.add_argument("--model", default="champion", help="champion (the registry's), or a trained model: teacher, student, ...")
    p.add_argument("--input", required=True, help="file, folder or glob in one source's raw schema")
    p.add_argument("--output", required=True, help="predictions file (.parquet, or .csv); quarantined rows go beside it")
    p.add_argument("--source", default=None, help="the config source whose mapping the input follows (default: the one that fits)")
    p.add_argument("--no-log", action="store_true",
                   help="do not append the scores to <workdir>/prediction_log (default: monitoring.prediction_log.enabled)")
    p.add_argument("--logged-at", default=None,
                   help="time the prediction log records the scores at (UTC, e.g. 2026-01-05T12:00): replaying a past "
                        "day's traffic, so that the monitor's periods are that day's (default: now)")
    p.add_argument("--workdir", default=None, help="work directory (default: the config's)")
    add_set_argument(p)
    p.set_defaults(func=_predict)
