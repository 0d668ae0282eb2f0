"""`lattice trees fit`: one LightGBM booster per objective, fitted on the train split's labelled rows
(the validation split's labelled rows only stop it early; test rows are never read), written under
`paths.trees` with the dense stats and sparse encodings its matrix was built with, so that every
later reader turns a row into the same leaf ids (`leaf_ids`). Per objective, not one multi-output
booster: LightGBM's binary boosters are single-output, and each objective is labelled on
different rows (its mask).

Cross-fitting (`models.leaves.fit_share` below 1): the boosters and their sparse encodings are
fitted only on the train rows whose `lattice.trees.leaves.fit_fraction` is below the share, a
rule of the example id alone (no row order, no partitioning), and a network that reads the leaves
gives exactly those rows an empty leaf bag while it trains (`LeafForest.empty_fitted`, applied by
the training loader), so its leaf embeddings learn only from rows the trees never saw."""

from __future__ import annotations

import json
import shutil
import time

import lightgbm as lgb
import numpy as np

from lattice.config import PlatformConfig
from lattice.data.loader import find_table, fit_dense_stats
from lattice.models.gbdt import TreeFeatures, fit_booster, lgb_params
from lattice.paths import Paths
from lattice.training.gbdt_stage import read_rows
from lattice.training.threads import machine_threads
from lattice.trees.leaves import FIT_RULE, fitted_rows

VERSION = 1


def fit_trees(config: PlatformConfig, paths: Paths, seed: int | None = None) -> dict:
    started = time.perf_counter()
    leaves = config.models.leaves
    base = config.models.baselines.trees
    settings = base.model_copy(update={"num_leaves": leaves.num_leaves, "max_rounds": leaves.num_trees})
    seed = config.training.seed if seed is None else seed
    params = lgb_params(settings, seed, settings.num_threads or machine_threads())
    table = find_table(paths)
    out = paths.trees
    shutil.rmtree(out, ignore_errors=True)
    (out / "boosters").mkdir(parents=True)
    stats = fit_dense_stats(config, table)
    stats.save(out / "dense_stats.json")
    arrs, split = read_rows(config, table, stats)
    train, valid = split == "train", split == "validation"
    share = float(leaves.fit_share)
    fit = train.copy()
    fit[train] = fitted_rows(arrs["example_id"][train], share)  # cross-fitting: the share's rows only
    features = TreeFeatures.fit(config, [c.column for c in stats.columns], arrs, fit, settings.max_categories,
                                with_domain=True)
    features.save(out / "encodings.npz")
    x = features.matrix(arrs)
    boosters = {}
    for o in config.objective_names:
        labelled = arrs[f"mask:{o}"] > 0
        y = arrs[f"label:{o}"].astype(np.float64)
        f = fit_booster(params, settings, features, x[fit & labelled], y[fit & labelled],
                        x[valid & labelled], y[valid & labelled])
        if f.booster is not None:
            f.booster.save_model(str(out / "boosters" / f"{o}.txt"), num_iteration=f.best_round)
        boosters[o] = f.describe()
    manifest = {"version": VERSION, "params": params, "num_trees": leaves.num_trees, "num_leaves": leaves.num_leaves,
                "fit_share": share, "train_rows": int(train.sum()), "fit_rows": int(fit.sum()),
                "held_out_train_rows": int((train & ~fit).sum()), "validation_rows": int(valid.sum()), "boosters": boosters,
                "features": features.describe(), "seconds": time.perf_counter() - started}
    if share < 1.0:
        manifest["fit_rule"] = FIT_RULE
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def leaf_ids(paths: Paths, x: np.ndarray) -> dict[str, np.ndarray]:
    """Per objective: (rows, trees) int leaf index of each row in each fitted tree (LightGBM pred_leaf)."""
    return {p.stem: np.asarray(lgb.Booster(model_file=str(p)).predict(x, pred_leaf=True), dtype=np.int64).reshape(len(x), -1)
            for p in sorted((paths.trees / "boosters").glob("*.txt"))}
