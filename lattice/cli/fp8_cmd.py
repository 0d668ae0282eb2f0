"""`lattice fp8 plan CONFIG --model teacher|student`: re-plan a trained model's FP8 sites from the
probe statistics saved with it, print the per-site table and write models/<model>/fp8_plan.json.

The thresholds come from CONFIG (with `--set`), so `--set fp8.max_relative_error=0.03` shows
what a stricter plan would choose; the model itself is not changed.
"""

from __future__ import annotations

import argparse
import json
import sys

from lattice.cli.common import add_set_argument, config_and_paths


def _plan(args: argparse.Namespace) -> int:
    import torch

    from lattice.fp8.dispatch import load_probe_state, make_plan, plan_table
    from lattice.models.saved import load_saved

    config, paths = config_and_paths(args)
    try:
        saved = load_saved(paths.model_dir(args.model))
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    state = saved.blob.get("fp8_probe")
    if not state:
        print(f"error: {saved.path} has no FP8 probe statistics; train it with `fp8.enabled: true` in the config "
              f"(or `lattice train {args.config} --model {args.model} --set fp8.enabled=true`)", file=sys.stderr)
        return 1
    load_probe_state(saved.model, state)
    device = "cuda" if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9) else "cpu"
    plan = make_plan(saved.model, config.fp8, device=device)
    out = paths.model_dir(args.model) / "fp8_plan.json"
    out.write_text(json.dumps(plan, indent=2))
    print(plan_table(plan))
    print(f"\nplan: {out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fp8", help="FP8 dispatch: per-site error estimate and plan of a trained model")
    fsub = p.add_subparsers(dest="fp8_command", metavar="ACTION", required=True)
    q = fsub.add_parser("plan", help="re-plan a trained model's FP8 sites from its saved probe statistics")
    q.add_argument("config", help="platform config YAML (its fp8 section sets the thresholds)")
    q.add_argument("--model", required=True, help="trained model name, e.g. teacher or student")
    q.add_argument("--workdir", default=None, help="default: the config's workdir (or $LATTICE_WORKDIR)")
    add_set_argument(q)
    q.set_defaults(func=_plan)
