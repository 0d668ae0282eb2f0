"""The features DAG's wall time against the same steps in one process, on the same data.

Three ways to run the features family of a tiny copy of a config (the demo's by default), each
from fresh processes, on one set of synthetic raw logs generated once beforehand:

- `one`: `lattice run CONFIG --to materialize`, every step in one process (the reference);
- `dag`: the DAG's tasks as they are now (`DagSpec.airflow_tasks`: the synthetic step, then
  consolidate .. materialize in one task sharing one Spark session), each task a fresh Python
  process that imports the Airflow task SDK first, as a LocalExecutor task does;
- `per_step` (with --before N, in the last N rounds): one fresh process per step, the DAG as it was before the Spark
  steps were grouped (each starting its own Spark JVM).

The modes alternate within each round, so drift in the machine's load falls on all of them.
Airflow's own per-task cost (scheduling, the task supervisor, API calls) is not in these figures:
they compare what the tasks themselves run.

    nice -n 10 env PYTHONPATH=$PWD python bench/bench_features_dag.py --rows 6000 --runs 3 [--before 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

# one Airflow task: the steps it runs, in a fresh process (run_task for one step, run_steps for a group)
TASK = r"""
import sys, json
import airflow.sdk  # a task process imports the task SDK before the task's code
from lattice.config import load_config
from lattice.orchestration.spec import dag_specs, defaults
from lattice.orchestration.task_runner import run_steps, run_task
config_file, ids = sys.argv[1], sys.argv[2].split(",")
spec = next(s for s in dag_specs(load_config(config_file)) if s.family == "features")
steps = [t for t in spec.tasks if t.task_id in ids]
params = {**defaults(spec)}
assert [t.task_id for t in steps] == ids, (ids, [t.task_id for t in steps])
if len(steps) == 1:
    run_task(config_file, steps[0], params, spec.params)
else:
    run_steps(config_file, steps, params, spec.params)
print("TASK DONE", ",".join(ids), flush=True)
"""


def _config(tmp: Path, source: Path, rows: int) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))  # the tiny copy of a config that the DAG tests use
    from tiny_dags import tiny

    data = tiny(yaml.safe_load(source.read_text()), data_root=tmp / "raw", workdir=tmp / "work", name="bench")
    data["synthetic"] = {**data["synthetic"], "rows": rows}
    path = tmp / "bench.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LATTICE_SPARK_MEMORY": os.environ.get("LATTICE_SPARK_MEMORY", "2g")}
    env.pop("LATTICE_SPARK_MASTER", None)
    return env


def _run(cmd: list[str], log, done: str | None = None) -> float:
    t = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True)
    log.write(out.stdout + out.stderr)
    log.flush()
    if out.returncode or (done and done not in out.stdout):
        raise SystemExit(f"failed ({out.returncode}): {' '.join(cmd)}; see the log {log.name}")
    return time.perf_counter() - t


def one_process(config: Path, log) -> float:
    return _run([sys.executable, "-m", "lattice.cli", "run", str(config), "--to", "materialize", "--quiet"], log,
                done="stage=materialize")


def as_tasks(config: Path, groups: list[list[str]], log) -> float:
    # a script file, not `python -c`: pyspark takes a __main__ without a file for its own doctests
    # and exits 0 at the first Spark Connect import (the step would silently not run)
    script = Path(log.name).with_name("task.py")
    script.write_text(TASK)
    return sum(_run([sys.executable, str(script), str(config), ",".join(g)], log, done=f"TASK DONE {','.join(g)}")
               for g in groups)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "demo.yaml")
    ap.add_argument("--rows", type=int, default=6000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--before", type=int, default=0, metavar="N",
                    help="also time one process per step (the DAG before grouping) in the last N rounds")
    ap.add_argument("--keep", type=Path, help="work folder to keep (default: a temporary one)")
    args = ap.parse_args()

    from lattice.config import load_config
    from lattice.orchestration.spec import dag_specs

    tmp = args.keep or Path(tempfile.mkdtemp(prefix="bench_features_dag_"))
    tmp.mkdir(parents=True, exist_ok=True)
    config = _config(tmp, args.config, args.rows)
    spec = next(s for s in dag_specs(load_config(config)) if s.family == "features")
    grouped = [[t.task_id for t in g.steps] for g in spec.airflow_tasks]
    modes = {"one": lambda log: one_process(config, log), "dag": lambda log: as_tasks(config, grouped, log)}
    if args.before:
        modes["per_step"] = lambda log: as_tasks(config, [[t.task_id] for t in spec.tasks], log)
    times: dict[str, list[float]] = {m: [] for m in modes}
    with open(tmp / "bench.log", "w") as log:
        as_tasks(config, [[spec.tasks[0].task_id]], log)  # the raw logs, once: every run reads the same data
        for round_ in range(args.runs):
            for mode, fn in modes.items():
                if mode == "per_step" and round_ < args.runs - args.before:
                    continue  # the last N rounds: what is cut short first
                times[mode].append(round(fn(log), 1))
                print(f"{mode}: {times[mode][-1]} s", file=sys.stderr, flush=True)
                (tmp / "times.json").write_text(json.dumps(times))  # survives a run cut short
    median = {m: round(statistics.median(v), 1) for m, v in times.items() if v}
    result = {"config": str(args.config.name), "rows": args.rows, "runs": args.runs, "dag_tasks": grouped,
              "seconds": times, "median_s": median, "dag_over_one": round(median["dag"] / median["one"], 2)}
    if "per_step" in median:
        result["per_step_over_one"] = round(median["per_step"] / median["one"], 2)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
