"""Loader benchmark: examples/s the streaming parquet loader delivers (0, 1, 2 worker processes)
against what the trainer consumes (the teacher's measured training throughput, same run).

    nice .venv/bin/python bench/bench_loader.py --rows 200000

Uses the table bench_train.py prepared (or prepares it). Goal: loader >= 5x trainer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lattice.config import load_config  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--workdir", default=None)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--max-batches", type=int, default=150)
    args = p.parse_args()
    workdir = Path(args.workdir or ROOT / ".lattice" / f"bench_train_{args.rows}")

    sys.path.insert(0, str(ROOT / "bench"))
    from bench_train import prepare
    from lattice.data.loader import BatchLoader, find_table, fit_dense_stats

    config, paths = prepare(load_config(args.config), args.rows, workdir)
    root = find_table(paths)
    stats = fit_dense_stats(config, root)
    print(f"{os.cpu_count()} cores; table {root}")
    rates = {}
    for workers in (0, 1, 2):
        loader = BatchLoader(config, root, stats, "train", batch_size=args.batch_size, num_workers=workers)
        t = time.perf_counter()
        n = 0
        for i, b in enumerate(loader):
            n += len(b)
            if i + 1 >= args.max_batches:
                break
        rates[workers] = n / (time.perf_counter() - t)
        print(f"loader, {workers} worker(s): {rates[workers]:>10,.0f} examples/s")
    # what the trainer consumes: the teacher training step alone, 1 rank, same batch size
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_train.py"), "--throughput-worker", "--impl", "torchrec",
                          "--config", args.config, "--workdir", str(workdir), "--rows", str(args.rows), "--steps", "20",
                          "--batch-size", str(args.batch_size)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    line = [x for x in res.stdout.splitlines() if x.startswith("{")]
    if not line:
        print(res.stderr[-2000:])
        return
    trainer = json.loads(line[-1])["examples_per_s"]
    best = max(rates.values())
    print(f"trainer (teacher, 1 rank): {trainer:>10,.0f} examples/s")
    print(f"loader / trainer = {best / trainer:.1f}x (goal >= 5x)")


if __name__ == "__main__":
    main()
