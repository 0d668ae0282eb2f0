"""How much the student should follow the teacher (`distillation.soft_weight`): with the usual
config (the leaves in both networks, the student on the trees' margin, `fit_share: auto`), one
teacher per seed, then one student per soft weight distilled from the same teacher scores, and
optionally the `separate` baseline. Prints the mean test NE per objective over the seeds and each
student's share of the teacher's gain over separate (issue 38's goal: 90%). The students are left
as `student@soft<W>` in the dataset's work folder, so `bench_tree_leaves.py --compare
student@soft1=student@soft3` gives the paired interval on the last seed's test rows. `--margin-only`:
also each weight's student without the leaf tokens, on the trees' margin alone (`student@soft<W>m`).

    nice -n 5 .venv/bin/python bench/bench_distill_weight.py --dataset bank --bank-split hash --seeds 0,1,2 --weights 1,2,3,5 --separate
    nice -n 5 .venv/bin/python bench/bench_distill_weight.py --dataset taobao --reuse --seeds 0,1 --weights 1,3 --separate

Datasets and tables as bench_tree_leaves.py (the same work folders). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_tree_leaves as B  # noqa: E402  (the datasets and the run helpers)


def _seeded(cfg, seed: int):
    return cfg.model_copy(update={"training": cfg.training.model_copy(update={"seed": seed})})


def _soft(cfg, weight: float):
    return cfg.model_copy(update={"distillation": cfg.distillation.model_copy(update={"soft_weight": weight})})


def _margin_only(cfg):
    leaves = cfg.models.leaves.model_copy(update={"tokens": ["teacher"]})
    return cfg.model_copy(update={"models": cfg.models.model_copy(update={"leaves": leaves})})


def main() -> None:
    from lattice.training.stages import score
    from lattice.trees.fit import fit_trees

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="bank", choices=["bank", "demo", "taobao", "criteo"])
    ap.add_argument("--bank-split", default="hash", choices=["time", "hash"])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--weights", default="1,3", help="distillation.soft_weight values, e.g. 1,2,3,5")
    ap.add_argument("--separate", action="store_true", help="also the separate baseline (the share of the gain)")
    ap.add_argument("--margin-only", action="store_true",
                    help="also each weight's student reading the leaf ids for its margin only (models.leaves.tokens: [teacher])")
    ap.add_argument("--reuse", action="store_true", help="keep a training set already built in the work folder")
    ap.add_argument("--demo-rows", type=int, default=200_000)
    ap.add_argument("--workdir", default=str(B.ROOT / ".lattice" / "bench_tree_leaves"))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    weights = [float(w) for w in a.weights.split(",")]
    wd = Path(a.workdir) / a.dataset
    config, paths = (B.bank_table(wd, a.bank_split) if a.dataset == "bank"
                     else B.shipped(a.dataset, wd, a.reuse, a.demo_rows, []))
    config = config.model_copy(update={"training": config.training.model_copy(update={"num_workers": 0})})
    m = config.models
    trees = m.baselines.trees.model_copy(update={"num_threads": 1})  # LightGBM's OpenMP on 2 shared cores: see bench_tree_leaves
    config = config.model_copy(update={"models": m.model_copy(update={"baselines": m.baselines.model_copy(update={"trees": trees})})})
    plain = B.with_leaves(config, [], 50, 15)
    usual = B.with_leaves(config, ["teacher", "student"], 50, 15, margin=("student",), fit_share="auto")
    manifest = fit_trees(usual, paths)
    print(f"[{a.dataset}] trees: fit share {manifest['fit_share']:g}", flush=True)
    runs: dict[str, list[dict]] = {}
    for seed in seeds:
        print(f"[{a.dataset}] seed {seed}", flush=True)
        runs.setdefault("teacher", []).append(B.run_one(_seeded(usual, seed), paths, "teacher@soft", None))
        scores = score(_seeded(usual, seed), paths, "teacher@soft", "all", progress=False)
        for w in weights:
            runs.setdefault(f"student, soft {w:g}", []).append(
                B.run_one(_seeded(_soft(usual, w), seed), paths, f"student@soft{w:g}", None, teacher_scores=scores))
            if a.margin_only:
                runs.setdefault(f"student, soft {w:g}, margin only", []).append(
                    B.run_one(_seeded(_soft(_margin_only(usual), w), seed), paths, f"student@soft{w:g}m", None,
                              teacher_scores=scores))
        if a.separate:
            runs.setdefault("separate", []).append(B.run_one(_seeded(plain, seed), paths, "separate", None))
    mean = lambda rows, o: float(np.mean([r["by_objective"][o] for r in rows]))  # noqa: E731
    out: dict[str, dict] = {}
    for o in config.objective_names:
        print(f"\n[{a.dataset}] {o}: test NE, mean of seeds {seeds}")
        for name, rows in runs.items():
            line = f"  {name:<18} {mean(rows, o):.4f}   per seed " + " ".join(f"{r['by_objective'][o]:.4f}" for r in rows)
            share = None
            if "separate" in runs and name.startswith("student"):
                gain = mean(runs["separate"], o) - mean(runs["teacher"], o)
                if gain > 0:
                    share = (mean(runs["separate"], o) - mean(rows, o)) / gain
                    line += f"   keeps {share:.0%} of the teacher's gain over separate ({gain:+.4f})"
            print(line, flush=True)
            out.setdefault(o, {})[name] = {"mean": mean(rows, o), "per_seed": [r["by_objective"][o] for r in rows],
                                           "share_of_gain": share}
    dest = Path(a.out or B.ROOT / ".lattice" / "bench" / f"bench_distill_weight_{a.dataset}.json")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1))
    print(f"\nfigures written to {dest}")


if __name__ == "__main__":
    main()
