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


def run_dataset(cfg_file: str, workdir: Path, nproc: int, epochs: int | None) -> dict:
    from lattice.cli.train_cmd import summary_table
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
    metrics = {}
    for model in ["teacher", *baseline_names(config)]:
        t = time.perf_counter()
        run_stage("train", config, paths, model=model, nproc=nproc if model == "teacher" else 1, epochs=epochs, progress=False)
        metrics[model] = json.loads((paths.model_dir(model) / "metrics.json").read_text())
        print(f"[{config.name}] {model}: {time.perf_counter() - t:.0f}s, best epoch {metrics[model].get('best_epoch')}", flush=True)
    print(f"\n{config.name}: test NE per (domain, objective)\n" + summary_table(config, metrics))
    by_obj = {m: {o: v["ne"] for o, v in x["by_objective"].items()} for m, x in metrics.items()}
    print("macro NE per objective: " + "; ".join(
        f"{m} " + ", ".join(f"{o} {ne:.4f}" for o, ne in objs.items()) for m, objs in by_obj.items()))
    beats = {o: all(by_obj["teacher"][o] < by_obj[b][o] for b in by_obj if b != "teacher") for o in config.objective_names}
    print(f"teacher beats every baseline on macro NE, per objective: {beats}\n", flush=True)
    return {"macro_ne_by_objective": by_obj, "cells": {m: {c: v["ne"] for c, v in x["cells"].items()} for m, x in metrics.items()},
            "teacher_beats_every_baseline": beats}


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
