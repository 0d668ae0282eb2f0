"""What one Spark start costs a task: a fresh Python process (as each Airflow task is) that imports
pyspark, creates the platform's session (`pipelines.spark.get_spark`, local master) and runs one
tiny action, timed from the process's first line to the end of that action. Median of `--runs`.

    PYTHONPATH=$PWD python bench/bench_spark_start.py [--runs 3]

The features DAG has one such start in each of its Spark tasks (consolidate, aggregates,
training_set, materialize; feast_apply reads no Spark); the figure times the count of them is what
one shared session per DAG run would save at most."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import json, time
t0 = time.perf_counter()
from pipelines.spark import get_spark
t1 = time.perf_counter()
spark = get_spark()
t2 = time.perf_counter()
spark.range(10).count()
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "session_s": t2 - t1, "first_action_s": t3 - t2, "total_s": t3 - t0}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LATTICE_SPARK_MEMORY": "1g"}
    env.pop("LATTICE_SPARK_MASTER", None)
    runs = []
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    median = {k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}
    print(json.dumps({"runs": args.runs, "median": median, "all_total_s": [round(r["total_s"], 2) for r in runs]}))


if __name__ == "__main__":
    main()
