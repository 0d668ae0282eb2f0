"""Replay monitoring rules over a finished moving-market run (bench_market_life.py, part C) and
judge every trip and every miss against the market's truth.

The kept workdir's served predictions are joined again with all their labels (`lattice monitor`
over the whole run: one cell per day, domain, objective and served version), then each rule is
applied day by day to the series known that day (what the daily monitor DAG would have seen), and
compared with the served model's true calibration that day (bench_market_life.true_calibration:
sum of served p / sum of true p). The served models stay those of the run: a rule that would have
tripped more often does not retrain here.

    PYTHONPATH=$PWD .venv/bin/python bench/market_rules_replay.py --workdir /tmp/bench-market-life-XXXX --json /tmp/mk/run.json

Prints, per rule: trips (real / noise by the truth), and cell-days whose true calibration was
outside the bounds with no trip that day or in the 2 days before (misses). Asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True, help="the run's kept workdir (its `workdir` line)")
    ap.add_argument("--json", required=True, help="the run's --json file")
    args = ap.parse_args()

    import pandas as pd

    from bench_market_life import build_config, quiet, true_calibration
    from lattice.config.monitoring import CalibrationRule
    from lattice.monitoring.rules import check
    from lattice.paths import Paths
    from lattice.stages import run_stage

    report = json.loads(Path(args.json).read_text())
    run_args = SimpleNamespace(**report["args"])
    base = Path(args.workdir)
    cfg = build_config(run_args, run_args.market_seed, not run_args.no_shock, base)
    serve = Paths(workdir=(base / "serve").resolve(), data_root=base / "raw")
    days = sorted(d for d, r in report["C"]["days"].items() if "calibration" in r)
    last = dt.date.fromisoformat(days[-1]) + dt.timedelta(days=1)
    with quiet():
        run_stage("monitor", cfg, serve, end=str(last), lookback_days=len(days) + 1, period="day", mlflow=False)
    cells = pd.read_parquet(serve.workdir / "monitoring" / "metrics.parquet")
    cells = cells[cells["objective"] == "click"]
    truth = {d: true_calibration(serve.workdir, d) for d in days}
    low, high = run_args.cal_low, run_args.cal_high
    rules = {
        "point estimate, 1 day, >= 100 positives": CalibrationRule(kind="calibration", low=low, high=high, min_positives=100, periods=1, confidence=0),
        "95% interval, 1 day, >= 100 positives": CalibrationRule(kind="calibration", low=low, high=high, min_positives=100, periods=1),
        "95% interval, 2 days each, >= 200 (the default)": CalibrationRule(kind="calibration", low=low, high=high),
        "95% interval, 3 days pooled, >= 100": CalibrationRule(kind="calibration", low=low, high=high, min_positives=100, periods=3, pooled=True),
        "95% interval, 7 days pooled, >= 100": CalibrationRule(kind="calibration", low=low, high=high, min_positives=100, periods=7, pooled=True),
    }
    print(f"seed {run_args.market_seed}, shock {'none' if run_args.no_shock else 'day ' + str(run_args.shock_day)}; "
          f"{len(days)} days; bounds [{low}, {high}]\n")
    print("| rule | trips | real | noise | missed cell-days (true calibration outside, no trip within 2 days) |")
    print("|---|---|---|---|---|")
    for name, rule in rules.items():
        trips = []
        for d in days:
            start = pd.Timestamp(d, tz="UTC")
            known = cells[cells["period_start"] <= start]
            findings, _ = check([rule], known, pd.DataFrame(), period="day")
            trips += [(d, f"{f['domain']}/{f['objective']}") for f in findings if f["last_period"] == d]
        real = [(d, c) for d, c in trips if not low <= truth[d].get(c, 1.0) <= high]
        tripped = set(trips)
        near = lambda d, c: any((str(dt.date.fromisoformat(d) - dt.timedelta(days=k)), c) in tripped for k in range(3))  # noqa: E731
        missed = [(d, c) for d in days for c, v in truth[d].items() if not low <= v <= high and not near(d, c)]
        print(f"| {name} | {len(trips)} | {len(real)} | {len(trips) - len(real)} | {len(missed)} |")


if __name__ == "__main__":
    main()
