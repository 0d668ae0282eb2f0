"""Is a day's features run flat in the history? Day 2 against day N of the demo market.

On the moving demo market (`bench/configs/demo_market.yaml`: date-partitioned raw logs), the
features chain (`pipelines.stages.run_features`, what the features DAG's task runs) lives forward
in time as a daily schedule would: day 1, then day 2 (`--runs` times: each re-run of the newest
day is what a retry does), then days 3..N-1 in one run over their interval (the tables it leaves
equal day-by-day runs: tests/integration/test_pipeline_demo.py), then day N (`--runs` times). All
in one process and one Spark session (a DAG task starts its own; that start costs every day the
same). Prints per day the median wall time, each stage's median, the raw rows read and the rows
each run rewrote, then the ratio day N / day 2 (issue 34's goal: at most 1.2). Asserts nothing.

    nice .venv/bin/python bench/bench_day_cost.py --days 21 --rows-per-day 5000 --runs 3
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=int, default=21)
    ap.add_argument("--rows-per-day", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("LATTICE_SPARK_MEMORY", "2g")

    from lattice.config import load_config
    from lattice.data.synth import generate
    from lattice.paths import Paths
    from pipelines.stages import run_features

    base = Path(tempfile.mkdtemp(prefix="bench-day-cost-"))
    cfg = load_config(ROOT / "bench" / "configs" / "demo_market.yaml")
    start = cfg.time_range.start
    cfg = cfg.model_copy(update={
        "data_root": str(base / "raw"),
        "time_range": cfg.time_range.model_copy(update={"end": start + dt.timedelta(days=args.days)}),
        "synthetic": cfg.synthetic.model_copy(update={"days": args.days}),
    })
    rows = args.days * args.rows_per_day
    generate(cfg, rows, base / "raw", progress=False)
    paths = Paths.for_config(cfg, base / "work")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; demo market "
          f"{rows:,} rows over {args.days} days (date-partitioned raw logs); {args.runs} run(s) per day")

    def day_run(day: dt.date, until: dt.date | None = None) -> tuple[float, dict]:
        t = time.perf_counter()
        s = run_features(cfg, paths, start=str(day), end=str(until or day + dt.timedelta(days=1)))
        return time.perf_counter() - t, s

    def record(wall: float, s: dict) -> dict:
        agg = s["stages"]["aggregates"]["aggregates"]
        return {"wall": wall, "stages": s["timings"], "raw": s.get("raw_rows_read"),
                "agg_rows": sum(a.get("rows_written", a["rows"]) for a in agg.values()),
                "ts_rows": s["stages"]["training_set"].get("rows_written")}

    first, _ = day_run(start)
    print(f"day 1 (builds the tables): {first:.1f} s")
    last_day = start + dt.timedelta(days=args.days - 1)
    seen: dict[str, list[dict]] = {"day 2": [record(*day_run(start + dt.timedelta(days=1))) for _ in range(args.runs)]}
    middle, _ = day_run(start + dt.timedelta(days=2), last_day)
    print(f"days 3..{args.days - 1} in one run over their interval: {middle:.1f} s")
    seen[f"day {args.days}"] = [record(*day_run(last_day)) for _ in range(args.runs)]

    stages = [k for k in seen["day 2"][0]["stages"] if k != "total"]
    print("\n| day | wall (median) | " + " | ".join(stages) + " | raw rows read | aggregate rows written | training-set rows written |")
    print("|---" * (len(stages) + 5) + "|")
    med = {}
    for name, runs in seen.items():
        med[name] = statistics.median(r["wall"] for r in runs)
        cells = [f"{statistics.median(r['stages'][k] for r in runs):.1f}" for k in stages]
        print(f"| {name} | {med[name]:.1f} s | " + " | ".join(cells)
              + f" | {runs[0]['raw']} | {runs[0]['agg_rows']:,} | {runs[0]['ts_rows']:,} |")
    last = f"day {args.days}"
    walls = {k: ", ".join(f"{r['wall']:.1f}" for r in v) for k, v in seen.items()}
    print("\nall walls (s): " + "; ".join(f"{k}: {w}" for k, w in walls.items()))
    print(f"ratio {last} / day 2: {med[last] / med['day 2']:.2f} (goal <= 1.2)")

if __name__ == "__main__":
    main()
