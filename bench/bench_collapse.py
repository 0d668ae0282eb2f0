"""One-epoch collapse: does a model's validation NE rise after its best point, and which model is
kept? Per dataset, trains the teacher with validation at epoch ends only (`old`: the defaults,
patience 2 epochs) and with 4 validations per epoch (`new`: patience 4 validations, the best
validation's weights kept), plus any extra
variants, for the same epochs; prints the validation macro NE curve (one point per validation),
the best point, the largest rise after it, the test macro NE of the kept model and the share of
training time spent validating.

    nice .venv/bin/python bench/bench_collapse.py --datasets demo --rows 200000
    nice .venv/bin/python bench/bench_collapse.py --datasets avazu,taobao
    nice .venv/bin/python bench/bench_collapse.py --datasets demo --variants "new,lr_sparse_02=training.lr_sparse=0.02"

Real samples (configs/<name>.yaml, data under LATTICE_SHARED_DATA or ../shared/data) are
consolidated with the pandas reference table (no Spark feature stage, so no aggregates): this
measures the trainer, not the features. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

OLD = ["training.evals_per_epoch=1", "training.early_stopping_patience=2"]  # epoch ends only
NEW = ["training.evals_per_epoch=4", "training.early_stopping_patience=4"]  # inside the epoch


def variants(spec: str) -> dict[str, list[str]]:
    """'old,new,name=key=value;key=value' -> variant -> config --set overrides."""
    out: dict[str, list[str]] = {}
    for part in filter(None, spec.split(",")):
        name, _, sets = part.partition("=")
        out[name] = {"old": OLD, "new": NEW}.get(name) or [s for s in sets.split(";") if s]
    return out


def dataset(name: str, rows: int, workdir: Path):
    from lattice.config import load_config
    from lattice.paths import Paths

    if name == "demo":
        from bench_train import prepare

        return prepare(load_config(ROOT / "configs" / "demo.yaml"), rows, workdir / "demo")
    from lattice.data.local_table import write_local_table

    config = load_config(ROOT / "configs" / f"{name}.yaml")
    paths = Paths.for_config(config, workdir / name)
    if not paths.consolidated.exists():
        t = time.perf_counter()
        write_local_table(config, paths)
        print(f"[{name}] consolidated (pandas reference) in {time.perf_counter() - t:.0f}s", flush=True)
    return config, paths


def train_variant(base, paths, name: str, sets: list[str], epochs: int) -> dict:
    from lattice.config.loader import apply_overrides, parse_config
    from lattice.training.stages import train
    from lattice.trees.fit import fit_trees_if_on

    config = parse_config(apply_overrides(base.model_dump(mode="json"), sets, "<bench>"), "<bench>") if sets else base
    model = f"teacher@{name}"
    fit_trees_if_on(config, paths)  # the leaf features' trees (models.leaves), as the pipeline's fit_trees
    t = time.perf_counter()
    summary = train(config, paths, model=model, nproc=1, epochs=epochs, progress=False)
    seconds = time.perf_counter() - t
    metrics = json.loads((paths.model_dir(model) / "metrics.json").read_text())
    curve = [(e["step"], e["epochs_done"], e["val_macro_ne"]) for e in summary["evals"]]
    best = min(range(len(curve)), key=lambda i: curve[i][2])
    rise = max((c[2] for c in curve[best + 1:]), default=curve[best][2]) - curve[best][2]
    test = metrics["macro"]["ne"] if isinstance(metrics["macro"], dict) and "ne" in metrics["macro"] else metrics["macro"]
    return {"variant": name, "sets": sets, "seconds": seconds, "eval_seconds": summary["eval_seconds"], "curve": curve,
            "best": curve[best], "rise_after_best": rise, "test_macro_ne": test, "best_step": summary["best_step"],
            "steps": summary["global_steps"]}


def report(label: str, r: dict) -> None:
    pts = " ".join(f"{ep:.2f}:{ne:.4f}" for _, ep, ne in r["curve"])
    print(f"{label} {r['variant']:>14}  curve (epochs:val macro NE) {pts}", flush=True)
    step, ep, ne = r["best"]
    test = r["test_macro_ne"]
    test_s = f"{test:.4f}" if isinstance(test, float) else json.dumps(test)
    print(f"{label} {r['variant']:>14}  best {ne:.4f} at step {step} ({ep:.2f} epochs) of {r['steps']}; largest rise "
          f"after it {r['rise_after_best']:+.4f}; kept model's test macro NE {test_s}; validation "
          f"{r['eval_seconds']:.0f}s of {r['seconds']:.0f}s ({100 * r['eval_seconds'] / r['seconds']:.1f}%)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="demo", help="comma list: demo and/or config names under configs/")
    ap.add_argument("--rows", type=int, default=200_000, help="synthetic demo rows")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--variants", default="old,new")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bench_collapse"))
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    out: dict[str, list[dict]] = {}
    for name in args.datasets.split(","):
        config, paths = dataset(name, args.rows, args.workdir)
        out[name] = []
        for v, sets in variants(args.variants).items():
            r = train_variant(config, paths, v, sets, args.epochs)
            report(f"[{name}]", r)
            out[name].append(r)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
