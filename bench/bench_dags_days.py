"""Issue 34's proof that the DAGs themselves live day by day: the whole chain (features, teacher,
student, gate) through Airflow's `dag.test()` on consecutive logical dates, on a tiny copy of the
demo config with a training window and warm starts.

First window: a manual features run over its days, a from-scratch teacher and student. Then, per
logical date L (a scheduled features run works on [L - 1 day, L)), in the order the features asset
starts the DAGs: the promote DAG judges yesterday's challenger on the day that just arrived, the
teacher continues from the last teacher on the new day, the student from the last student, and
the promote DAG runs once more and waits (the new challenger's test day is L, not yet logged).

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python bench/bench_dags_days.py --days 3

Prints one row per run and, with --json, writes them. The gate is the e2e demo test's (floors
loose enough for a few hundred rows a day): this checks orchestration, not model quality.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LOOSE_GATE = {"max_ne_regression": 0.2, "calibration": [0.2, 5.0], "teacher_epsilon": 0.5, "max_latency_ms": 1000,
              "max_artifact_mb": 200, "floors": {"max_ne": 1.5, "min_auc": 0.4}}


def _config(tmp: Path, rows: int, window: str) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))  # the tiny copy of a config that the DAG tests use
    from tiny_dags import tiny

    data = tiny(yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text()), data_root=tmp / "raw",
                workdir=tmp / "work", name="days")
    data["synthetic"] = {**data["synthetic"], "rows": rows}
    data["training"] = {**data["training"], "window": window, "warm_start": "last"}
    data["promotion"] = LOOSE_GATE
    folder = tmp / "configs"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "days.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--days", type=int, default=3, help="daily logical dates after the first window")
    ap.add_argument("--rows", type=int, default=14_000, help="synthetic rows over the demo's 14 days")
    ap.add_argument("--window", default="4d")
    ap.add_argument("--first", default="2026-01-06", help="first daily logical date (the first window ends the day before it)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-dags-days-"))
    from lattice.orchestration.airflow_env import apply_local_airflow_env

    apply_local_airflow_env(tmp / "airflow")  # before Airflow is imported
    os.environ["LATTICE_CONFIGS_DIR"] = str(_config(tmp, args.rows, args.window))
    os.environ["LATTICE_AIRFLOW_RETRIES"] = "0"
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils import db

    from lattice.orchestration.dag_test import run_scheduled, xcom

    db.initdb()
    dags = DagBag(dag_folder=str(ROOT / "dags")).dags
    rows: list[dict] = []

    def record(label: str, family: str, dr, seconds: float) -> dict:
        states = {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}
        row = {"run": label, "dag": family, "state": str(dr.state), "seconds": round(seconds, 1), "tasks": states}
        if family == "features":
            cons = (xcom(dr, "consolidate_to_materialize", "consolidate") or {}).get("summary", {})
            row.update(days=cons.get("partitions"), raw_rows_read=cons.get("raw_rows_read"),
                       rows_out=(cons.get("totals") or {}).get("rows_out"))
        elif family in ("train_teacher", "distill"):
            model = "teacher" if family == "train_teacher" else "student"
            lin = json.loads((tmp / "work" / "models" / model / "lineage.json").read_text())
            parent = lin.get("parent") or {}
            row.update(window_end=(lin.get("window") or {}).get("end"), trained_days=lin.get("trained_days"),
                       warm_start=lin.get("warm_start"), parent_days_seen=len(parent.get("days_seen") or []),
                       parent_sha=(parent.get("checksum") or "")[:12] or None, judged_on=lin.get("judged_on"))
        else:
            # the applied decision (promote_challenger) when there is one, else the gate's own
            gate = xcom(dr, "promote_challenger") or xcom(dr, "gate") or xcom(dr, "gate", "decision") or {}
            s = gate.get("summary", gate)
            row.update(decision=s.get("decision"), challenger=s.get("challenger_version"),
                       champion_after=s.get("champion_after"), judged_on=s.get("test_day") or s.get("judged_on"))
            if states.get("gate") == "skipped":  # the task log says why: "task 'gate' waits: no rows of <day> ..."
                row["decision"] = "waits (gate skipped: the challenger's test day has no rows yet)"
        rows.append(row)
        extra = {k: v for k, v in row.items() if k not in ("run", "dag", "state", "seconds", "tasks")}
        print(f"| {label} | {family} | {row['state']} | {row['seconds']} | {json.dumps(extra, default=str)} | "
              f"{json.dumps(states)} |", flush=True)
        return row

    def manual(label: str, family: str, conf: dict) -> None:
        t = time.perf_counter()
        record(label, family, dags[f"days__{family}"].test(run_conf=conf), time.perf_counter() - t)

    first = dt.date.fromisoformat(args.first)
    print("| run | DAG | state | s | what | tasks |\n|---|---|---|---|---|---|", flush=True)
    window_start = first - dt.timedelta(days=int(args.window[:-1]) + 1)
    manual("first window", "features", {"start": window_start.isoformat(), "end": (first - dt.timedelta(days=1)).isoformat()})
    for family in ("train_teacher", "distill"):
        manual("first window", family, {"epochs": 1, "nproc": 1})
    manual("first window", "promote", {"dry_run": False})
    for k in range(args.days):
        logical = dt.datetime.combine(first + dt.timedelta(days=k), dt.time(), tzinfo=dt.timezone.utc)
        label = f"L={logical.date()}"
        t = time.perf_counter()
        record(label, "features", run_scheduled(dags["days__features"], logical), time.perf_counter() - t)
        manual(label, "promote", {"dry_run": False})  # yesterday's challenger, on the day that just arrived
        for family in ("train_teacher", "distill"):
            manual(label, family, {"epochs": 1, "nproc": 1})
        manual(label, "promote", {"dry_run": False})  # today's challenger: its day is tomorrow, it waits
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, default=str))
    print(f"workdir {tmp}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
