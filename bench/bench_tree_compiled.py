"""How the tree part's leaf ids are best computed at serving (issue 38: "LightGBM itself, or a
compiled form ...: measure the latency each adds to a single request and to a batch of 256, and
choose"). On a forest `bench_tree_leaves.py` fitted (its cached work dir) and that table's test
rows, per call, one thread, medians of `--reps` calls per round, rounds alternated:

- `lightgbm`: `Booster.predict(x, pred_leaf=True, num_threads=1)`, what the predictor calls for
  more than one row (a single row goes through LightGBM's fast single-row API, `SingleRowLeaves`);
- `lightgbm-fast1`: that single-row API (batch 1 only);
- `gemm`: the forest as tensors, Hummingbird's GEMM form written here in torch (every split of
  every tree decided at once, each leaf found by one batched matrix product against its path),
  which could live inside the TorchScript artifact; checked equal to `pred_leaf` on 20,000 rows
  first (categorical splits, NaN and zero-as-missing included);
- `treelite`: Treelite's `gtil.predict_leaf` where `treelite` is installed (`pip install treelite`;
  not a dependency of the platform). Its ids are Treelite's node ids, not LightGBM's leaf
  indices, so only its time is compared.

    .venv/bin/python bench/bench_tree_compiled.py --datasets demo,bank,criteo,taobao

A dataset whose work dir `bench_tree_leaves.py --reuse` has not built yet is reported as missing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import lightgbm as lgb
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse(booster: lgb.Booster) -> list[tuple[list, dict]]:
    """Per tree: its splits (feature, threshold or category set, default_left, missing_type,
    categorical) numbered in walk order, and each leaf's path as (split, went_left) pairs."""
    trees = []
    for info in booster.dump_model()["tree_info"]:
        nodes: list[tuple] = []
        leaves: dict[int, list[tuple[int, bool]]] = {}

        def walk(n: dict, path: list[tuple[int, bool]]) -> None:
            if "split_index" not in n:  # a leaf (or a tree of one leaf)
                leaves[int(n.get("leaf_index", 0))] = path
                return
            i = len(nodes)
            cat = n["decision_type"] == "=="
            thr = {int(c) for c in str(n["threshold"]).split("||")} if cat else float(n["threshold"])
            nodes.append((int(n["split_feature"]), thr, bool(n["default_left"]), n["missing_type"], cat))
            walk(n["left_child"], path + [(i, True)])
            walk(n["right_child"], path + [(i, False)])

        walk(info["tree_structure"], [])
        trees.append((nodes, leaves))
    return trees


class GemmForest:
    """One booster's pred_leaf as tensor operations (Hummingbird's GEMM strategy): decide every
    split for every row, then a leaf is reached when the splits on its path went its way, i.e.
    when (decisions @ path matrix) equals the number of left turns on its path."""

    def __init__(self, booster: lgb.Booster):
        trees = parse(booster)
        T, I, L = len(trees), max(1, max(len(n) for n, _ in trees)), max(len(lv) for _, lv in trees)
        feat, thr = np.zeros((T, I), np.int64), np.full((T, I), np.inf)
        dl, nan_m, zero_m, cat = (np.zeros((T, I), bool) for _ in range(4))
        sets: list[tuple[int, int, set]] = []
        path = np.zeros((T, I, L), np.float32)
        need = np.full((T, L), -1.0, np.float32)  # a padded leaf is never reached
        for t, (nodes, leaves) in enumerate(trees):
            for i, (f, th, d, mt, c) in enumerate(nodes):
                feat[t, i], dl[t, i], nan_m[t, i], zero_m[t, i], cat[t, i] = f, d, mt == "NaN", mt == "Zero", c
                if c:
                    sets.append((t, i, th))
                else:
                    thr[t, i] = th
            for leaf, steps in leaves.items():
                for i, left in steps:
                    path[t, i, leaf] = 1.0 if left else -1.0
                need[t, leaf] = sum(left for _, left in steps)
        self.T, self.I = T, I
        self.max_cat = max((max(s) for _, _, s in sets), default=0) + 1
        table = np.zeros((T * I, self.max_cat), bool)
        for t, i, s in sets:
            table[t * I + i, sorted(s)] = True
        as_t = torch.from_numpy
        self.feat, self.thr, self.dl = as_t(feat.ravel()), as_t(thr.ravel()), as_t(dl.ravel())
        self.nan_m, self.zero_m, self.cat = as_t(nan_m.ravel()), as_t(zero_m.ravel()), as_t(cat.ravel())
        self.cat_nodes = torch.nonzero(self.cat).ravel()
        self.cat_table = as_t(table[self.cat_nodes.numpy()].ravel())
        self.path, self.need = as_t(path), as_t(need)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        v = x.index_select(1, self.feat)  # (n, T*I): each split's feature value
        nan = torch.isnan(v)
        v0 = torch.where(nan & ~self.nan_m, torch.zeros_like(v), v)  # LightGBM: NaN is 0.0 unless missing_type NaN
        missing = (self.nan_m & nan) | (self.zero_m & (v0.abs() <= 1e-35))
        left = torch.where(missing, self.dl.expand_as(v), v0 <= self.thr)
        if len(self.cat_nodes):  # membership of the integer value in the split's category set; NaN and < 0 go right
            vc = v.index_select(1, self.cat_nodes)
            iv = torch.where(torch.isnan(vc), torch.full_like(vc, -1.0), vc).to(torch.int64)
            ok = (iv >= 0) & (iv < self.max_cat)
            flat = torch.arange(len(self.cat_nodes)) * self.max_cat + iv.clamp(0, self.max_cat - 1)
            left[:, self.cat_nodes] = torch.take(self.cat_table, flat) & ok
        d = left.to(torch.float32).reshape(n, self.T, self.I).transpose(0, 1)  # (T, n, I)
        hit = torch.bmm(d, self.path) == self.need[:, None, :]  # (T, n, L)
        return hit.to(torch.int8).argmax(-1).T.contiguous()  # (n, T)


def load(name: str):
    from lattice.config import load_config
    from lattice.data.loader import find_table
    from lattice.models.gbdt import TreeFeatures
    from lattice.paths import Paths
    from lattice.training.gbdt_stage import read_rows
    from lattice.trees.leaves import LeafForest

    work = ROOT / ".lattice" / "bench_tree_leaves" / name
    if name == "bank":  # no shipped config: the bench's own (the table's stored split decides the rows)
        sys.path.insert(0, str(ROOT / "bench"))
        from bench_tree_leaves import bank_config

        config = bank_config(work, ("2009-01-01T00:00:00", "2010-01-01T00:00:00"))
    else:
        config = load_config(ROOT / "configs" / f"{name}.yaml")
    if name == "demo":
        config = config.model_copy(update={"data_root": str(work / "raw")})
    paths = Paths.for_config(config, work)
    forest = LeafForest.load(paths.trees)
    arrs, split = read_rows(config, find_table(paths), forest.stats)
    x = TreeFeatures([c.column for c in forest.stats.columns], forest.sparse, forest.with_domain).matrix(arrs)
    return forest, x, split


def median_ms(fn, rows: np.ndarray, n: int, reps: int, rng) -> float:
    times = []
    for _ in range(reps):
        xb = np.ascontiguousarray(rows[rng.choice(len(rows), n)])
        t0 = time.perf_counter()
        fn(xb)
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def run(name: str, rounds: int, reps: int) -> None:
    from lattice.trees.leaves import SingleRowLeaves

    try:
        forest, x, split = load(name)
    except Exception as exc:  # noqa: BLE001 - a dataset not built yet is reported, the others go on
        print(f"[{name}] missing: {type(exc).__name__}: {exc} (build it with bench_tree_leaves.py --datasets {name})")
        return
    rng = np.random.default_rng(0)
    test = x[split == "test"] if (split == "test").any() else x
    boosters = {o: lgb.Booster(model_str=s) for o, s in forest.boosters.items()}
    gemm = {o: GemmForest(b) for o, b in boosters.items()}
    fast = {o: SingleRowLeaves(b) for o, b in boosters.items()}
    check = x[rng.choice(len(x), min(20_000, len(x)), replace=False)]
    for o, b in boosters.items():
        want = np.asarray(b.predict(check, pred_leaf=True, num_threads=1), dtype=np.int64).reshape(len(check), -1)
        got = gemm[o](torch.from_numpy(check)).numpy()
        if not np.array_equal(want, got):
            raise SystemExit(f"[{name}] gemm leaf ids differ from LightGBM's on {int((want != got).sum())} (row, tree) pairs")
        print(f"[{name}] {o}: {b.num_trees()} trees, {gemm[o].I} splits at most per tree, "
              f"{len(gemm[o].cat_nodes)} categorical splits; gemm == pred_leaf on {len(check):,} rows")
    methods = {
        "lightgbm": lambda xb: [b.predict(xb, pred_leaf=True, num_threads=1) for b in boosters.values()],
        "gemm": lambda xb: [g(torch.from_numpy(xb)) for g in gemm.values()],
    }
    single = {"lightgbm-fast1": lambda xb: [f(xb[0]) for f in fast.values()]}
    try:
        sys.path.insert(0, "/tmp/tlpkg")  # a --target install beside the venv works too
        import treelite
        from treelite import gtil

        tl = {o: treelite.frontend.from_lightgbm(b) for o, b in boosters.items()}
        methods["treelite"] = lambda xb: [gtil.predict_leaf(m, xb, nthread=1) for m in tl.values()]
    except ImportError:
        print(f"[{name}] treelite: not installed (pip install treelite), not timed")
    results: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for n in (256, 1):
            for m, fn in {**methods, **(single if n == 1 else {})}.items():
                results.setdefault((m, n), []).append(median_ms(fn, test, n, reps, rng))
    for n in (256, 1):
        base = np.median(results[("lightgbm", n)])
        cells = [f"{m} {np.median(v):.3f} ms (x{np.median(v) / base:.2f})" for (m, k), v in results.items() if k == n]
        print(f"[{name}] batch {n:>3}, every objective's forest, median of {rounds} rounds: " + ", ".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="demo,bank")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)  # as `lattice serve` runs the model
    for name in args.datasets.split(","):
        run(name, args.rounds, args.reps)


if __name__ == "__main__":
    main()
