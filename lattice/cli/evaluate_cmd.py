"""`lattice evaluate CONFIG --model teacher [--model separate ...]`: per-cell report with plots."""

from __future__ import annotations

import argparse
import json
import sys

from lattice.cli.common import add_set_argument, config_and_paths


def _evaluate(args: argparse.Namespace) -> int:
    from lattice.cli.train_cmd import summary_table
    from lattice.evaluation.stages import evaluate
    from lattice.models.build import baseline_names

    config, paths = config_and_paths(args)
    names: list[str] = []
    for m in args.model or ["all"]:
        if m == "all":
            names += sorted(p.name for p in paths.models.glob("*") if (p / "metrics.json").exists())
        elif m == "all-baselines":
            names += baseline_names(config)
        else:
            names.append(m)
    names = list(dict.fromkeys(names))
    if not names:
        print(f"error: no trained models under {paths.models}; run `lattice train {args.config} --model teacher`", file=sys.stderr)
        return 1
    try:
        out = evaluate(config, paths, names)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    from lattice.evaluation.report import comparison_lines
    from lattice.evaluation.versus import versus_lines

    metrics = json.loads(open(out["report"]).read())["metrics"]
    print(summary_table(config, metrics))
    for line in versus_lines(out.get("vs_trees")):
        print(line)
    if out.get("calibration"):
        from lattice.evaluation.report import calibration_lines

        print("\nCalibration step (chosen per cell on validation; FLAG: test calibration moved further from 1 beyond noise):")
        print("\n".join(calibration_lines(out["calibration"])))
    if out.get("comparisons"):
        print("\nNE(B) - NE(A) on the same test rows, paired bootstrap 95% interval (negative: B better):")
        print("\n".join(comparison_lines(out["comparisons"])))
    print(f"\nreport: {out['report']}\nplots:  {out['plots']['ne_by_cell']}\n        {out['plots']['training_curves']}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="per-cell NE/AUC/calibration report comparing trained models and the oracle")
    p.add_argument("config", help="platform config YAML")
    p.add_argument("--model", action="append", help="model name (repeatable); 'all' (default) or 'all-baselines'")
    p.add_argument("--workdir", default=None, help="default: the config's workdir (or $LATTICE_WORKDIR)")
    add_set_argument(p)
    p.set_defaults(func=_evaluate)
