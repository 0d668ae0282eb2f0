"""`lattice hashing fit CONFIG [--workdir DIR] [--master M] [--end DATE] [--set K=V]`: fit the id
maps of the sparse features with vocab, mixed or learned hashing on the training split (after
`lattice features`; with training.window, the train days of the window that ends at `--end`, as
`lattice train --end`), one line per feature and row budget: distinct ids, kept, coverage, rows,
seconds."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from lattice.cli.common import add_set_argument, config_and_paths


def fit_line(feature: str, budget: int, m: dict[str, Any]) -> str:
    s = m["stats"]
    return (f"[{feature:<16}] {m['scheme']:<8} budget {budget:>10,}  distinct {s['distinct']:>10,}  kept {s['kept']:>10,}  "
            f"coverage {s['coverage']:7.2%}  rows {m['table_rows']:>10,}  {s['seconds']:6.1f}s")


def _fit(args: argparse.Namespace) -> int:
    from lattice.data.loader import NoTrainingData
    from lattice.hashing.budgets import needs_fit

    config, paths = config_and_paths(args)
    if not needs_fit(config):
        print(f"hashing: no sparse feature of {config.name} uses vocab, mixed or learned hashing; nothing to fit")
        return 0
    from lattice.hashing.fit import fit_hashing

    print(f"hashing fit: {config.name} -> {paths.hashing}", flush=True)
    started = time.perf_counter()

    def show(feature: str, fits: dict[int, dict[str, Any]]) -> None:
        for budget, m in fits.items():
            print(fit_line(feature, budget, m), flush=True)

    try:
        summary = fit_hashing(config, paths, master=args.master, progress=show, end=args.end)
    except NoTrainingData as exc:
        print(f"hashing: {exc}", file=sys.stderr)
        return 1
    w = summary["window"]
    if summary.get("days"):
        d = summary["days"]
        print(f"window: train {d['train'][0]}..{d['train'][-1]}, validation {d['validation']} (interval end {d['end']})")
    print(f"\nfitted on the train split of {summary['table']}: {w['rows']:,} rows, {w['start']} .. {w['end']}"
          f"   ({time.perf_counter() - started:.1f}s)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hashing", help="fit the id maps of compressed embeddings (vocab, mixed, learned hashing)")
    hsub = p.add_subparsers(dest="hashing_command", metavar="ACTION", required=True)
    fit = hsub.add_parser("fit", help="fit every vocab / mixed / learned id map on the training split (after `lattice features`)")
    fit.add_argument("config", help="platform config YAML, e.g. configs/demo.yaml")
    fit.add_argument("--workdir", default=None, help="work directory (default: the config's workdir)")
    fit.add_argument("--end", default=None, help="with training.window: the interval end (YYYY-MM-DD, exclusive) "
                     "of the run these maps are for, as `lattice train --end` (default: the table's latest day + 1)")
    fit.add_argument("--master", default=None, help="Spark master (default: the scale-out profile's master if deployment.profile is scale-out, else local[2])")
    add_set_argument(fit)
    fit.set_defaults(func=_fit)
