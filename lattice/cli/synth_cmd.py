"""`lattice synth --config FILE --rows N --out DIR`."""

from __future__ import annotations

import argparse
import json
import time

from lattice.cli.common import load_or_exit


def _synth(args: argparse.Namespace) -> int:
    from lattice.data.synth import generate

    config = load_or_exit(args.config)
    started = time.perf_counter()
    if args.rows is None:
        args.rows = config.synthetic.rows if config.synthetic else 200_000
    manifest = generate(config, args.rows, args.out, progress=not args.quiet)
    took = time.perf_counter() - started
    print(json.dumps(manifest["rows_per_domain"]))
    print(f"wrote {args.rows:,} rows to {args.out} in {took:.1f}s ({args.rows / max(took, 1e-9):,.0f} rows/s)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("synth", help="write synthetic multi-domain raw logs with true label probabilities")
    p.add_argument("--config", default="configs/demo.yaml", help="platform config with a 'synthetic' section")
    p.add_argument("--rows", type=int, default=None, help="impressions to generate (all domains together; default: the config's synthetic.rows)")
    p.add_argument("--out", required=True, help="output folder (one sub-folder per domain)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_synth)
