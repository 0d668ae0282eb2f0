"""How much of a Spark task's log is library noise, and how long its Spark start takes.

Runs the `consolidate` task of the features DAG (task_runner.execute, as the DAG does) on tiny synthetic demo data in a child process captured as an
Airflow 3 task is: records of Python's `logging` (root at INFO) become log lines with their level,
whatever the process writes to stdout becomes INFO and to stderr ERROR (the task supervisor's
rule). A line is the platform's when its logger is ours (lattice, pipelines, features); anything
else (another library's logger, a raw stdout/stderr line of the JVM) counts as noise.

    PYTHONPATH=$PWD python bench/bench_task_log_noise.py [--code DIR] [--rows 3000]

`--code DIR` runs the child on another checkout (e.g. the commit before a change, unpacked with
`git archive`); the child calls `lattice.quiet.library_notices()` only when the DAG file of that
checkout does (as the task would)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the JVM's relayed lines (pipelines.spark.jvm) are Spark's, not the platform's
OURS = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) (?!pipelines\.spark\.jvm)(lattice|pipelines|features)[.:]")

CHILD = r"""
import json, logging, os, sys, time
from pathlib import Path
# the task supervisor's log channel: every record with its level and logger
h = logging.StreamHandler(open(os.environ["LOG_FILE"], "w", buffering=1))
h.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
logging.getLogger().addHandler(h)
logging.getLogger().setLevel(logging.INFO)
if "library_notices()" in Path("dags/lattice_dags.py").read_text():
    from lattice.quiet import library_notices
    library_notices()
from lattice.config import load_config
from lattice.paths import Paths
from lattice.training.tiny import tiny
from lattice.orchestration.spec import dag_specs
from lattice.orchestration.task_runner import RunContext, execute
cfg = tiny(load_config("configs/demo.yaml"), data_root=os.environ["RAW"])
paths = Paths.for_config(cfg, os.environ["WORK"])
t0 = time.perf_counter()
from pipelines.spark import get_spark
spark = get_spark(config=cfg)
spark.range(1).count()
start_s = time.perf_counter() - t0
t1 = time.perf_counter()
spec = next(d for d in dag_specs(cfg) if d.family == "features")
task = next(t for t in spec.tasks if t.stage == "consolidate")
execute(RunContext(cfg, paths, {}), task, spec.params)  # as the DAG's task does, with its closing summary
Path(os.environ["LOG_FILE"] + ".json").write_text(json.dumps({"spark_start_s": start_s, "stage_s": time.perf_counter() - t1}))
"""


def run(code: Path, raw: Path, work: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        log_file = Path(tmp) / "records.log"
        env = {**os.environ, "PYTHONPATH": str(code), "RAW": str(raw), "WORK": str(work), "LOG_FILE": str(log_file),
               "LATTICE_SPARK_MEMORY": "1g"}
        script = Path(tmp) / "task.py"  # a file, as a task's module is (pyspark reads `__main__`)
        script.write_text(CHILD)
        proc = subprocess.run([sys.executable, str(script)], cwd=code, env=env, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"child failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        if not Path(str(log_file) + ".json").exists():
            sys.exit(f"child ended early:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        records = log_file.read_text().splitlines()
        figures = json.loads(Path(str(log_file) + ".json").read_text())
    # the supervisor splits a stream on newlines; a `\r` progress bar is one line per flush
    out = [f"INFO stdout: {x}" for x in proc.stdout.splitlines()]
    err = [f"ERROR stderr: {x}" for x in proc.stderr.replace("\r", "\n").splitlines() if x.strip()]
    lines = records + out + err
    noise = [x for x in lines if not OURS.match(x)]
    return {"lines": len(lines), "noise": len(noise), "noise_share": round(len(noise) / max(len(lines), 1), 3),
            "error_lines": sum(x.startswith(("ERROR", "CRITICAL")) for x in lines),
            "noise_sample": sorted({x[:110] for x in noise})[:12], **{k: round(v, 2) for k, v in figures.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--code", type=Path, default=ROOT)
    ap.add_argument("--rows", type=int, default=3000)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from lattice.config import load_config
    from lattice.data.synth import generate
    from lattice.training.tiny import tiny

    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw"
        generate(tiny(load_config(ROOT / "configs" / "demo.yaml"), data_root=str(raw)), args.rows, raw, progress=False)
        started = time.perf_counter()
        result = run(args.code.resolve(), raw, Path(tmp) / "work")
        result["child_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
