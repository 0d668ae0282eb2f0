"""`lattice trees fit CONFIG [--workdir DIR] [--end DATE] [--set K=V]`: fit the leaf-feature trees
(issue 38) on the train split of the training table (validation only for early stopping); with
training.window, on the window that ends at `--end` (as `lattice train --end`)."""

from __future__ import annotations

import argparse
import sys

from lattice.cli.common import add_set_argument, config_and_paths


def _fit(args: argparse.Namespace) -> int:
    from lattice.data.loader import NoTrainingData
    from lattice.trees.fit import fit_trees

    config, paths = config_and_paths(args)
    print(f"trees fit: {config.name} -> {paths.trees}", flush=True)
    try:
        m = fit_trees(config, paths, end=args.end)
    except NoTrainingData as exc:
        print(f"trees: {exc}", file=sys.stderr)
        return 1
    if m.get("window"):
        w = m["window"]
        print(f"window: train {w['train'][0]}..{w['train'][-1]}, validation {w['validation']} (interval end {w['end']})")
    for o, b in m["boosters"].items():
        print(f"[{o:<12}] trees {b['best_round']:>4}  leaves {b['leaves']:>6}  train rows {b['train_rows']:>9,}  "
              f"validation rows {b['valid_rows']:>9,}  optimism {b.get('optimism') or 0:.4f}")
    auto = m.get("fit_share_auto")
    print(f"fit share {m['fit_share']:g} ({m['fit_rows']:,} of {m['train_rows']:,} train rows)"
          + (f"; auto: {auto['why']}" if auto else ""))
    print(f"fitted in {m['seconds']:.1f}s")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trees", help="fit the gradient-boosted trees whose leaf ids feed the deep models")
    tsub = p.add_subparsers(dest="trees_command", metavar="ACTION", required=True)
    fit = tsub.add_parser("fit", help="fit one LightGBM per objective on the training split (after `lattice features`)")
    fit.add_argument("config", help="platform config YAML, e.g. configs/demo.yaml")
    fit.add_argument("--workdir", default=None, help="work directory (default: the config's workdir)")
    fit.add_argument("--end", default=None, help="with training.window: the interval end (YYYY-MM-DD, exclusive) the "
                     "window ends at, as `lattice train --end` (default: the day after the table's newest day)")
    add_set_argument(fit)
    fit.set_defaults(func=_fit)
