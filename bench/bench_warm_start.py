"""Warm start against from-scratch retraining, day by day, judged on the next day.

On the synthetic demo market (tiny model sizes, `lattice.training.tiny`), for every day D from
`--first` on: (a) the teacher warm-started from yesterday's (training.warm_start: last) trains on
day D only, once per `--dense` value (training.warm_dense_stats: keep or refit); (b) a
from-scratch teacher trains on the trailing window. Both use the same window (`--window`, ending
after day D: validation D, test D+1), so both are judged on the same next day. Prints per day the
next-day macro NE of each and the training examples processed, then the means and ratios.
Prints figures; asserts nothing.

    nice .venv/bin/python bench/bench_warm_start.py --rows 60000 --window 4d --first 6 [--dense keep,refit]

The market here does not move (no new-id days, drift or shocks: the demo generator); a moving
market is the synthetic generator's part of issue 34.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=60_000)
    ap.add_argument("--window", default="4d")
    ap.add_argument("--first", type=int, default=6, help="first day (1-based) the two are compared on")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--dense", default="keep,refit", help="warm starts to run: training.warm_dense_stats values")
    args = ap.parse_args()

    from lattice.config import load_config
    from lattice.data.local_table import write_local_table
    from lattice.data.synth import generate
    from lattice.paths import Paths
    from lattice.training.stages import train
    from lattice.training.tiny import tiny

    base = Path(tempfile.mkdtemp(prefix="bench-warm-"))
    cfg = tiny(load_config(ROOT / "configs" / "demo.yaml"), data_root=str(base / "raw"), batch_size=256)
    cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={"window": args.window, "epochs": args.epochs})})
    generate(cfg, args.rows, base / "raw", progress=False)
    paths = Paths.for_config(cfg, base / "work")
    write_local_table(cfg, paths)
    start, days = cfg.time_range.start, cfg.synthetic.days
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; demo market {args.rows:,} rows "
          f"over {days} days; window {args.window}; {args.epochs} epoch(s)")

    def run(name: str, day: int, warm: str, dense: str = "keep") -> dict:
        end = (start + dt.timedelta(days=day)).isoformat()  # after day `day` (1-based): test = day + 1
        t = time.perf_counter()
        c = cfg.model_copy(update={"training": cfg.training.model_copy(update={"warm_dense_stats": dense})})
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):  # the trainer's plan and notes
            s = train(c, paths, name, nproc=1, end=end, warm_start=warm, progress=False)
        m = json.loads((paths.model_dir(name) / "metrics.json").read_text())
        return {"ne": m["macro"]["ne"], "examples": sum(e["examples"] for e in s["history"]),
                "seconds": time.perf_counter() - t, "trained": s["lineage"]["trained_days"]}

    variants = args.dense.split(",")
    for v in variants:
        run(f"teacher@warm_{v}", args.first - 1, "none")  # each warm chain's first model: a from-scratch window
    rows = []
    head = " ".join(f"{'warm ' + v + ' NE':>14}" for v in variants)
    print(f"{'day':>4} {'test day':>11} {head} {'scratch NE':>10} {'warm ex':>8} {'scratch ex':>10}")
    for day in range(args.first, days):
        ws = {v: run(f"teacher@warm_{v}", day, "last", v) for v in variants}
        s = run("teacher@scratch", day, "none")
        rows.append((ws, s))
        test = (start + dt.timedelta(days=day)).isoformat()
        cells = " ".join(f"{ws[v]['ne']:>14.4f}" for v in variants)
        print(f"{day:>4} {test:>11} {cells} {s['ne']:>10.4f} {ws[variants[0]]['examples']:>8,} {s['examples']:>10,}")
    ms = sum(s["ne"] for _, s in rows) / len(rows)
    es = sum(s["examples"] for _, s in rows)
    for v in variants:
        mw = sum(w[v]["ne"] for w, _ in rows) / len(rows)
        ew = sum(w[v]["examples"] for w, _ in rows)
        better = sum(w[v]["ne"] < s["ne"] for w, s in rows)
        print(f"warm ({v} dense stats): mean next-day macro NE {mw:.4f} against scratch {ms:.4f} (ratio {mw / ms:.4f}, "
              f"better on {better}/{len(rows)} days); examples {ew:,} = {ew / es:.2f}x scratch's {es:,}; "
              f"seconds {sum(w[v]['seconds'] for w, _ in rows):.0f} against {sum(s['seconds'] for _, s in rows):.0f}")

if __name__ == "__main__":
    main()
