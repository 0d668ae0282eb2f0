"""Numeric encodings of the dense features (`models.teacher.numeric`): per-objective test macro NE
of the teacher with each encoding (none, ple, quantile, periodic) on the same table, split, seed
and epochs, side by side, and the ratio to `none` (today's z-score MLP) measured in the same run.

    nice .venv/bin/python bench/bench_numeric.py --dataset demo --rows 200000 --epochs 1
    nice .venv/bin/python bench/bench_numeric.py --dataset criteo --epochs 2 --seeds 0,1,2

`demo`: the synthetic demo logs (configs/demo.yaml, generated here); `criteo`: the shared Criteo
sample (configs/criteo.yaml: I1..I13 heavy-tailed counts), consolidated with the pandas reference
(no Spark, so no aggregate columns). `--seeds` repeats every encoding with other seeds (model init
and shuffling) and prints the mean and spread, since small samples give noisy NE. Prints figures;
asserts nothing. Figures go to .lattice/bench/bench_numeric_<dataset>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

ENCODINGS = ("none", "ple", "quantile", "periodic")


def prepare_dataset(name: str, rows: int, workdir: Path):
    from lattice.config import load_config
    from lattice.paths import Paths

    if name == "demo":
        from bench_train import prepare

        return prepare(load_config(str(ROOT / "configs" / "demo.yaml")), rows, workdir / f"demo_rows{rows}")
    from lattice.data.local_table import write_local_table

    config = load_config(str(ROOT / "configs" / f"{name}.yaml"))
    paths = Paths.for_config(config, workdir / name)
    paths.ensure()
    if not paths.consolidated.exists():
        t = time.perf_counter()
        write_local_table(config, paths)
        print(f"consolidated {name} (pandas reference) in {time.perf_counter() - t:.0f}s", flush=True)
    return config, paths


def train_encoding(base, paths, encoding: str, bins: int, seed: int, epochs: int | None, nproc: int) -> dict:
    from lattice.config.loader import apply_overrides, parse_config
    from lattice.training.stages import train
    from lattice.trees.fit import fit_trees_if_on

    # no loader worker processes: many trainings in one process on a loaded 2-core machine
    # segfaulted a forked worker once; the same for every encoding
    sets = [f"models.teacher.numeric={encoding}", f"models.teacher.numeric_bins={bins}", "training.num_workers=0"]
    config = parse_config(apply_overrides(base.model_dump(mode="json"), sets, "<bench>"), "<bench>")
    model = f"teacher@numeric_{encoding}_s{seed}"
    fit_trees_if_on(config, paths)  # the leaf features' trees (models.leaves), as the pipeline's fit_trees
    t = time.perf_counter()
    summary = train(config, paths, model=model, nproc=nproc, epochs=epochs, seed=seed, progress=False)
    seconds = time.perf_counter() - t
    metrics = json.loads((paths.model_dir(model) / "metrics.json").read_text())
    return {"model": model, "seconds": seconds, "best_epoch": summary.get("best_epoch"),
            "macro": {o: v["ne"] for o, v in metrics["by_objective"].items()},
            "cells": {c: v["ne"] for c, v in metrics["cells"].items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="demo", help="demo, or a configs/<name>.yaml with dense features (criteo)")
    p.add_argument("--rows", type=int, default=200_000, help="synthetic rows (demo only)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--bins", type=int, default=16, help="models.teacher.numeric_bins")
    p.add_argument("--encodings", default=",".join(ENCODINGS))
    p.add_argument("--seeds", default="0")
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--workdir", default=str(ROOT / ".lattice" / "bench_numeric"))
    args = p.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}, "
          f"load avg {os.getloadavg()[0]:.1f}", flush=True)
    config, paths = prepare_dataset(args.dataset, args.rows, Path(args.workdir))
    encodings = args.encodings.split(",")
    if "none" not in encodings:
        encodings.insert(0, "none")
    seeds = [int(s) for s in args.seeds.split(",")]
    runs: dict[str, list[dict]] = {e: [] for e in encodings}
    for seed in seeds:  # seed-major: a stopped run still has every encoding at the first seeds
        for e in encodings:
            r = train_encoding(config, paths, e, args.bins, seed, args.epochs, args.nproc)
            runs[e].append(r)
            print(f"{args.dataset} {e} seed {seed}: {r['seconds']:.0f}s, best epoch {r['best_epoch']}, macro NE "
                  + ", ".join(f"{o} {v:.4f}" for o, v in r["macro"].items()), flush=True)
    objs = list(runs["none"][0]["macro"])
    mean = {e: {o: statistics.mean(r["macro"][o] for r in rs) for o in objs} for e, rs in runs.items()}
    spread = {e: {o: (statistics.stdev(r["macro"][o] for r in rs) if len(rs) > 1 else 0.0) for o in objs} for e, rs in runs.items()}
    print(f"\n{args.dataset}: test macro NE per objective (mean of {len(seeds)} seed(s)"
          + (", ± std" if len(seeds) > 1 else "") + f"; {args.epochs} epoch(s), {args.bins} bins), and vs none")
    print(f"{'encoding':<10}" + "".join(f"{o:>28}" for o in objs) + f"{'train s':>10}")
    for e in encodings:
        row = f"{e:<10}"
        for o in objs:
            rel = mean[e][o] / mean["none"][o] - 1
            sd = f"±{spread[e][o]:.4f}" if len(seeds) > 1 else ""
            row += f"{mean[e][o]:>10.4f}{sd:>8} ({rel:+.2%})"
        row += f"{statistics.mean(r['seconds'] for r in runs[e]):>10.0f}"
        print(row)
    dest = ROOT / ".lattice" / "bench" / f"bench_numeric_{args.dataset}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps({"dataset": args.dataset, "rows": args.rows, "epochs": args.epochs, "bins": args.bins, "seeds": seeds,
                                "mean": mean, "std": spread, "runs": runs}, indent=2))
    print(f"figures written to {dest}")


if __name__ == "__main__":
    main()
