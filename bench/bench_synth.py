"""Generator throughput and peak memory at several sizes (each size in a fresh process, so the
peak RSS is that run's own). Memory should stay flat as N grows: the generator streams chunks.

    .venv/bin/python bench/bench_synth.py --rows 100000 1000000 10000000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

CHILD = """
import sys, time, json, resource
from lattice.config import load_config
from lattice.data.synth import generate
cfg = load_config(sys.argv[1])
t = time.perf_counter()
generate(cfg, int(sys.argv[2]), sys.argv[3], progress=False)
took = time.perf_counter() - t
print(json.dumps({"seconds": took, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(config: str, rows: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        res = subprocess.run([sys.executable, "-c", CHILD, config, str(rows), out], capture_output=True, text=True, check=True)
        stats = json.loads(res.stdout.strip().splitlines()[-1])
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
    return {"rows": rows, "rows_per_s": rows / stats["seconds"], "disk_mib": size / 2**20, **stats}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}")
    results = [run(args.config, n) for n in args.rows]
    base = results[0]
    print(f"{'rows':>12} {'seconds':>9} {'rows/s':>12} {'peak RSS MiB':>13} {'RSS vs first':>13} {'disk MiB':>9}")
    for r in results:
        print(f"{r['rows']:>12,} {r['seconds']:>9.1f} {r['rows_per_s']:>12,.0f} {r['peak_rss_mib']:>13.0f} "
              f"{r['peak_rss_mib'] / base['peak_rss_mib']:>12.2f}x {r['disk_mib']:>9.0f}")


if __name__ == "__main__":
    main()
