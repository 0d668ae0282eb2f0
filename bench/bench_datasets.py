"""Teacher vs baselines on the shared real samples (Avazu: site vs app traffic; Taobao: three
item-category groups x engage/buy), through the same pipeline as the demo: the Spark feature
stage (validation, aggregates, Feast, point-in-time training set), then every model on the same
split and metrics.

    nice .venv/bin/python bench/bench_datasets.py                      # avazu and taobao
    nice .venv/bin/python bench/bench_datasets.py --configs configs/taobao.yaml --nproc 1

Prints one per-cell test-NE table per dataset (with macro NE per objective) and says, per
objective, whether the teacher beats every baseline; asserts nothing. These samples are small
(Avazu about 10k rows, Taobao about 100k), so a cell with few positives has a noisy NE.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def run_dataset(cfg_file: str, workdir: Path, nproc: int, epochs: int | None) -> dict:
    from bench_train import quality

    from lattice.config import load_config
    from lattice.models.build import baseline_names
    from lattice.paths import Paths
    from lattice.stages import run_stage

    config = load_config(cfg_file)
    paths = Paths.for_config(config, workdir / config.name)
    paths.ensure()
    t = time.perf_counter()
    summary = run_stage("features", config, paths)
    c = summary["counts"]
    print(f"[{config.name}] features: {c['consolidate']['rows_in']:,} rows in, {c['consolidate']['quarantined']:,} quarantined, "
          f"training set {c['training_set']:,} rows ({time.perf_counter() - t:.0f}s)", flush=True)
    return quality(config, paths, ["teacher", *baseline_names(config)], nproc, epochs, baseline_nproc=1, label=f"[{config.name}] ")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default="configs/avazu.yaml,configs/taobao.yaml")
    p.add_argument("--workdir", default=str(ROOT / ".lattice" / "bench_datasets"))
    p.add_argument("--nproc", type=int, default=2, help="ranks for the teacher (baselines train on one)")
    p.add_argument("--epochs", type=int, default=None, help="default: each config's training.epochs")
    args = p.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}, "
          f"load avg {os.getloadavg()[0]:.1f}", flush=True)
    out = {}
    for cfg in args.configs.split(","):
        out[Path(cfg).stem] = run_dataset(cfg, Path(args.workdir), args.nproc, args.epochs)
    dest = ROOT / ".lattice" / "bench" / "bench_datasets.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=2))
    print(f"figures written to {dest}")


if __name__ == "__main__":
    main()
