"""Compressed embeddings at equal memory: per-(domain, objective) test NE against embedding
parameter bytes for full tables (exact ids, `vocab` with a row per id), the hashing trick
(`modulo`), QR, mixed-dimension, TorchRec's zero-collision tables (`zch`) and learned hashing, at
2x, 4x, 16x and 64x fewer rows than the id count.

    nice .venv/bin/python bench/bench_hashing.py --datasets demo --rows 1000000
    nice .venv/bin/python bench/bench_hashing.py --datasets avazu,taobao

The schemes apply to every sparse feature with at least `--min-ids` distinct training ids (the
small fields keep exact ids in every run, so only the big tables differ). Every run trains the
same model (`--model`, default the teacher) on the same table, split, seed and epochs. Prints one
table per dataset, the goals (learned at 16x within 0.3% of full tables and ahead of modulo and QR
at the same bytes; the served artifact shrinking with the rows; the fit under a tenth of the
teacher's training time) and writes a plot of NE against bytes (one line per scheme) to
.lattice/bench/bench_hashing_<dataset>.png. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SCHEMES = ("modulo", "qr", "mixed", "zch", "learned")
RATIOS = (2, 4, 16, 64)
CONFIGS = {"demo": "configs/demo.yaml", "avazu": "configs/avazu.yaml", "taobao": "configs/taobao.yaml"}


def prepare(name: str, rows: int, workdir: Path):
    """(config, paths) with a table to train on: the synthetic demo through the pandas reference
    consolidation, real samples through the Spark feature stage."""
    from lattice.config import load_config
    from lattice.paths import Paths
    from lattice.stages import run_stage

    config = load_config(ROOT / CONFIGS[name])
    if name == "demo":
        from bench_train import prepare as prepare_synthetic

        return prepare_synthetic(config, rows, workdir / f"demo{rows}")
    paths = Paths.for_config(config, workdir / name)
    paths.ensure()
    if not paths.training_set.exists():
        run_stage("features", config, paths)
    return config, paths


def distinct_ids(config, paths) -> dict[str, int]:
    from lattice.data.loader import find_table, fit_dense_stats

    return dict(fit_dense_stats(config, Path(find_table(paths))).distinct_ids or {})


def variant(config, distinct: dict[str, int], scheme: str, ratio: int, min_ids: int):
    """The config with every big feature's table at id count / ratio rows under `scheme`."""
    sparse = []
    for f in config.features.sparse:
        n = distinct.get(f.name, 0)
        if n < min_ids:
            sparse.append(f.model_copy(update={"hashing": "vocab", "num_embeddings": max(4, n + 1)}))
        else:
            sparse.append(f.model_copy(update={"hashing": scheme, "num_embeddings": max(4, math.ceil(n / ratio))}))
    return config.model_copy(update={"features": config.features.model_copy(update={"sparse": sparse})})


def run_one(config, paths, model: str, tag: str, epochs: int | None) -> dict:
    from lattice.config.summary import embedding_bytes
    from lattice.export.stages import export_model
    from lattice.hashing.budgets import needs_fit
    from lattice.training.stages import train
    from lattice.trees.fit import fit_trees_if_on

    fit_s = 0.0
    if needs_fit(config):
        from lattice.hashing.fit import fit_hashing

        t = time.perf_counter()
        fit_hashing(config, paths, seed=config.training.seed)
        fit_s = time.perf_counter() - t
    name = f"{model}@{tag}"
    fit_trees_if_on(config, paths)  # the leaf features' trees (models.leaves), as the pipeline's fit_trees
    t = time.perf_counter()
    train(config, paths, model=name, nproc=1, epochs=epochs, progress=False)
    train_s = time.perf_counter() - t
    d = paths.model_dir(name)
    metrics = json.loads((d / "metrics.json").read_text())
    exported = export_model(config, paths, name)
    cost = metrics.get("cost", {})
    return {"cells": {c: v["ne"] for c, v in metrics["cells"].items()},
            "macro": float(sum(v["ne"] for v in metrics["cells"].values()) / max(len(metrics["cells"]), 1)),
            "embedding_bytes": int(cost.get("embedding_params", 0)) * 4 or embedding_bytes(config),
            "lookup_bytes": int(cost.get("lookup_bytes", 0)), "artifact_mb": exported["artifact_mb"],
            "fit_seconds": fit_s, "train_seconds": train_s}


def plot(name: str, results: dict, dest: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def state(r: dict) -> float:  # what the artifact carries for the ids: tables and id maps / buffers
        return (r["embedding_bytes"] + r.get("lookup_bytes", 0)) / 2**20

    fig, ax = plt.subplots(figsize=(7, 4.5))
    full = results.get("full")
    for scheme in SCHEMES:
        pts = sorted((state(r), r["macro"]) for k, r in results.items() if k.startswith(scheme + "@"))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=scheme)
    if full:
        ax.scatter([state(full)], [full["macro"]], marker="*", s=160, color="black", label="full (exact ids)", zorder=5)
    ax.set_xscale("log")
    ax.set_xlabel("embedding tables + id maps (MiB; tables fp32)")
    ax.set_ylabel("test NE (mean over cells; lower is better)")
    ax.set_title(f"{name}: NE against embedding memory")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(dest, dpi=110)
    plt.close(fig)


def bench_dataset(name: str, args) -> dict:
    config, paths = prepare(name, args.rows, Path(args.workdir))
    config = config.model_copy(update={"training": config.training.model_copy(update={"nproc": 1, "seed": args.seed})})
    distinct = distinct_ids(config, paths)
    big = {k: v for k, v in distinct.items() if v >= args.min_ids}
    print(f"[{name}] distinct training ids of the compressed features: {big}", flush=True)
    results: dict[str, dict] = {}
    runs = [("full", variant(config, distinct, "vocab", 1, args.min_ids))]
    runs += [(f"{s}@{r}x", variant(config, distinct, s, r, args.min_ids)) for r in args.ratios for s in args.schemes]
    # figures are written after every run, so a long bench that is stopped keeps what it finished
    partial = paths.workdir / f"bench_hashing_{args.model}_epochs{args.epochs}{f'_seed{args.seed}' if args.seed else ''}.json"
    done = json.loads(partial.read_text()) if args.reuse and partial.exists() else {}
    for tag, cfg in runs:
        if tag in done:
            results[tag] = done[tag]
            print(f"[{name}] {tag}: kept from {partial}", flush=True)
            continue
        r = results[tag] = done[tag] = run_one(cfg, paths, args.model, tag.replace("@", "_"), args.epochs)
        partial.write_text(json.dumps(done, indent=2, default=float))
        print(f"[{name}] {tag:<12} NE {r['macro']:.4f}  embeddings {r['embedding_bytes'] / 2**20:8.2f} MiB  "
              f"lookup {r['lookup_bytes'] / 2**20:6.2f} MiB  artifact {r['artifact_mb']:7.2f} MB  "
              f"fit {r['fit_seconds']:5.1f}s  train {r['train_seconds']:5.0f}s", flush=True)
    full = results["full"]
    cells = list(full["cells"])
    print(f"\n[{name}] test NE per cell (relative to full tables)")
    print(f"{'run':<12}" + "".join(f"{c:>22}" for c in cells) + f"{'mean':>10}{'MiB':>9}")
    for tag, r in results.items():
        print(f"{tag:<12}" + "".join(f"{r['cells'][c]:>12.4f} ({r['cells'][c] / full['cells'][c] - 1:+.2%})" for c in cells)
              + f"{r['macro']:>10.4f}{r['embedding_bytes'] / 2**20:>9.2f}")
    goals = {}
    if "learned@16x" in results:
        lr = results["learned@16x"]
        goals["learned16_vs_full"] = lr["macro"] / full["macro"] - 1
        goals["learned16_beats"] = {s: lr["macro"] < results[f"{s}@16x"]["macro"] for s in ("modulo", "qr") if f"{s}@16x" in results}
        goals["artifact_shrink_16x"] = full["artifact_mb"] / max(lr["artifact_mb"], 1e-9)
        goals["fit_over_train"] = lr["fit_seconds"] / max(full["train_seconds"], 1e-9)
        print(f"[{name}] learned at 16x: NE {goals['learned16_vs_full']:+.2%} vs full (goal <= +0.3%); beats "
              + ", ".join(f"{s} {'yes' if b else 'no'}" for s, b in goals["learned16_beats"].items())
              + f"; artifact {goals['artifact_shrink_16x']:.1f}x smaller; fit {lr['fit_seconds']:.1f}s = "
              f"{goals['fit_over_train']:.1%} of the full teacher's training ({full['train_seconds']:.0f}s, goal < 10%)")
    dest = ROOT / ".lattice" / "bench" / f"bench_hashing_{name}.png"
    dest.parent.mkdir(parents=True, exist_ok=True)
    plot(name, results, dest)
    print(f"[{name}] plot: {dest}")
    return {"distinct": distinct, "results": results, "goals": goals}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default="demo,avazu", help=f"comma list of {sorted(CONFIGS)}")
    p.add_argument("--rows", type=int, default=1_000_000, help="synthetic demo rows")
    p.add_argument("--model", default="teacher")
    p.add_argument("--epochs", type=int, default=None, help="default: the config's training.epochs")
    p.add_argument("--schemes", type=lambda s: s.split(","), default=list(SCHEMES))
    p.add_argument("--ratios", type=lambda s: [int(x) for x in s.split(",")], default=list(RATIOS))
    p.add_argument("--seed", type=int, default=0, help="training.seed of every run, and the seed of the hash fit")
    p.add_argument("--min-ids", type=int, default=256, help="compress the features with at least this many distinct ids")
    p.add_argument("--workdir", default=str(ROOT / ".lattice" / "bench_hashing"))
    p.add_argument("--reuse", action="store_true", help="keep the runs a previous bench of the same model, epochs and seed finished")
    args = p.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}, "
          f"load avg {os.getloadavg()[0]:.1f}", flush=True)
    dest = ROOT / ".lattice" / "bench" / "bench_hashing.json"
    # the figures of datasets not in this run stay as they were
    out = json.loads(dest.read_text()) if dest.exists() else {}
    for name in args.datasets.split(","):
        out[name] = bench_dataset(name, args)
        dest.write_text(json.dumps(out, indent=2, default=float))
    print(f"figures written to {dest}")


if __name__ == "__main__":
    main()
