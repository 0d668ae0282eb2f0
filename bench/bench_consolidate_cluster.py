"""Consolidation on `local[2]` vs the Spark standalone cluster of the scale-out profile (a master
and two 1-core workers on loopback), on the same synthetic demo log: median of several runs each,
and the ratio cluster / local.

    .venv/bin/python bench/bench_consolidate_cluster.py --rows 10000000 --repeats 3   # the issue's size
    .venv/bin/python bench/bench_consolidate_cluster.py --rows 20000 --repeats 3      # smoke

Each run is its own driver process (a fresh JVM, as a scheduled job gets): `wall_s` counts that
start, `job_s` is the consolidation's own total after its session exists. The cluster is the
one of `--profile-file` (from `infra/scale-out up`) if it answers, else a throwaway one started
here and stopped at the end. Prints the machine and its load average next to the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def machine() -> dict:
    return {"cpus": os.cpu_count(), "load_avg": [round(x, 2) for x in os.getloadavg()],
            "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}


def make_data(rows: int, base: Path) -> Path:
    from lattice.config import load_config
    from lattice.data.synth import generate

    text = (ROOT / "configs" / "demo.yaml").read_text()
    text = re.sub(r"^data_root:.*$", f"data_root: {base / 'raw'}", text, flags=re.M)
    cfg_file = base / "demo.yaml"
    cfg_file.write_text(text)
    generate(load_config(cfg_file), rows, base / "raw", progress=False)
    return cfg_file


def run_once(cfg_file: Path, master: str, workdir: Path, partitions: int) -> dict:
    env = dict(os.environ, LATTICE_SHUFFLE_PARTITIONS=str(partitions), LATTICE_SPARK_MEMORY=os.environ.get("LATTICE_SPARK_MEMORY", "4g"))
    t = time.perf_counter()
    r = subprocess.run([sys.executable, str(ROOT / "pipelines" / "consolidate.py"), "--config", str(cfg_file),
                        "--workdir", str(workdir), "--master", master], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode:
        # the root cause (a driver heap error, say) is usually far above the last lines
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "driver.log").write_text(r.stderr)
        raise SystemExit(f"consolidation on {master} failed (its whole log: {workdir / 'driver.log'}):\n{r.stderr[-3000:]}")
    out = json.loads(r.stdout[r.stdout.index("{"):])
    timings = out.get("timings", {})
    return {"wall_s": wall, "job_s": timings.get("total", wall) - timings.get("spark_session", 0.0)}


def cluster(profile_file: Path):
    """(master URL, stop function): the profile's cluster if it answers, else a throwaway one."""
    from lattice.deploy import local_services as ls
    from lattice.deploy import spark_cluster as sc
    from lattice.deploy.profile import read_profile

    if profile_file.exists():
        master = read_profile(profile_file).spark_master
        host, port = master.removeprefix("spark://").rsplit(":", 1)
        with socket.socket() as s:
            if s.connect_ex((host, int(port))) == 0:
                return master, lambda: None
    home = Path(tempfile.mkdtemp(prefix="lattice-bench-spark-"))
    ports = {}
    for name in ls.DEFAULT_PORTS:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports[name] = s.getsockname()[1]
    layout = ls.Layout(home=home, secrets=home / "secrets", ports=ports)
    sc.start_spark(layout)
    return sc.master_url(layout), lambda: sc.stop_spark(layout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="synthetic impressions (the issue asks for 10000000)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=8, help="shuffle partitions (both runs)")
    ap.add_argument("--profile-file", type=Path, default=Path("~/.lattice/scale-out/profile.json").expanduser())
    ap.add_argument("--base", type=Path, default=None, help="data folder (default: a temporary one)")
    args = ap.parse_args()

    base = args.base or Path(tempfile.mkdtemp(prefix="lattice-bench-cc-"))
    t = time.perf_counter()
    cfg_file = make_data(args.rows, base)
    print(f"data: {args.rows:,} rows in {time.perf_counter() - t:.1f} s at {base}", flush=True)
    master, stop = cluster(args.profile_file)
    results: dict[str, list[dict]] = {"local[2]": [], master: []}
    try:
        for i in range(args.repeats):  # interleaved: a load spike on the shared machine hits both sides
            for m in results:
                # no brackets in the path: Spark reads `[2]` in a path as a glob
                side = "local" if m.startswith("local") else "cluster"
                results[m].append(run_once(cfg_file, m, base / f"work-{i}-{side}", args.partitions))
                print(f"run {i + 1} {m}: {results[m][-1]['wall_s']:.1f} s wall, {results[m][-1]['job_s']:.1f} s job", flush=True)
    finally:
        stop()
    med = {m: {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "job_s")} for m, runs in results.items()}
    local, clus = med["local[2]"], med[master]
    print(json.dumps({"rows": args.rows, "repeats": args.repeats, "machine": machine(),
                      "median": {"local[2]": local, "standalone (2 workers x 1 core)": clus},
                      "ratio_cluster_over_local": {k: round(clus[k] / local[k], 3) for k in local},
                      "rows_per_s_job": {"local[2]": round(args.rows / local["job_s"]),
                                         "standalone": round(args.rows / clus["job_s"])}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
