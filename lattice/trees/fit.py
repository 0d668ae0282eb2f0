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
the training loader), so its leaf embeddings learn only from rows the trees never saw; a network
that starts at the trees' margin (`models.leaves.margin`) reads every row's leaves instead."""

from __future__ import annotations

import json
import shutil
import time

import lightgbm as lgb
import numpy as np

from lattice.config import PlatformConfig
from lattice.data.loader import find_table, fit_dense_stats
from lattice.evaluation.metrics import ne
from lattice.models.gbdt import TreeFeatures, fit_booster, lgb_params
from lattice.paths import Paths
from lattice.training.gbdt_stage import read_rows
from lattice.training.threads import machine_threads
from lattice.trees.leaves import FIT_RULE, fitted_rows

VERSION = 1


AUTO_SHARE = 0.7
"""The share `fit_share: auto` fits on when the forest over-fits its rows (0.7: the share measured
on every dataset of docs/bench/tree-leaves.md, "Cross-fitting")."""
AUTO_GAP = 0.04
"""`fit_share: auto` cross-fits when a booster's validation NE exceeds its NE on its own fit rows
by more than this share of the validation NE (the forest's optimism). Chosen between the demo at
200k rows (conversion 0.053, where cross-fitting helps beyond noise) and Bank Marketing's random
split (0.031, where it costs beyond noise); confirmed on Bank's time split, Taobao and Criteo
(docs/bench/tree-leaves.md, "fit_share: auto")."""


def fit_trees(config: PlatformConfig, paths: Paths, seed: int | None = None, end: str | None = None,
              data_end: str | None = None, validation_share: float | None = None) -> dict:
    """Fit the boosters at the config's `models.leaves.fit_share`; at `auto`, first on every train
    row, then again on `AUTO_SHARE` of them when a booster's optimism exceeds `AUTO_GAP`.

    `end` / `data_end`: a windowed run's interval end (training.window), the same the teacher's
    `train` takes: the boosters fit on the window's train days and stop on its validation day, so
    a forest never saw the labels of the rows its network is validated or tested on (with the
    stored split instead, the rows of every day marked train, the window's validation and test
    days included). The manifest records the window; training refuses a forest of another one.
    `validation_share`: the run's share of the newest day held out (training.window_validation
    unless a retrain overrides it, as `train` takes it)."""
    from lattice.data.window import fit_days

    started = time.perf_counter()
    leaves = config.models.leaves
    base = config.models.baselines.trees
    settings = base.model_copy(update={"num_leaves": leaves.num_leaves, "max_rounds": leaves.num_trees})
    seed = config.training.seed if seed is None else seed
    params = lgb_params(settings, seed, settings.num_threads or machine_threads())
    table = find_table(paths)
    # every train day of the window, as the gbdt baseline: a forest is never warm-started
    run = fit_days(config, table, end or data_end, validation_share)
    days = run.splits
    stats = fit_dense_stats(config, table, days)
    arrs, split = read_rows(config, table, stats, days)

    def at(share: float) -> dict:
        return _fit_at(config, paths, share, params, settings, stats, arrs, split)

    if leaves.fit_share != "auto":
        manifest = at(float(leaves.fit_share))
    else:
        manifest = at(1.0)
        gaps = {o: b["optimism"] for o, b in manifest["boosters"].items() if b.get("optimism") is not None}
        worst = max(gaps.values(), default=0.0)
        if worst > AUTO_GAP:
            chose, why = AUTO_SHARE, f"optimism {worst:.4f} > {AUTO_GAP}: the forest over-fits its rows"
        else:
            chose, why = 1.0, f"optimism {worst:.4f} <= {AUTO_GAP}: the forest's own rows' leaves are near honest"
        if chose < 1.0:
            manifest = at(chose)
        manifest["fit_share_auto"] = {"bound": AUTO_GAP, "optimism_at_share_1": gaps, "chose": chose, "why": why}
    manifest["fit_share_setting"] = leaves.fit_share
    manifest["window"] = run.record
    manifest["seconds"] = time.perf_counter() - started
    (paths.trees / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def _fit_at(config: PlatformConfig, paths: Paths, share: float, params: dict, settings, stats, arrs: dict,
            split: np.ndarray) -> dict:
    """One fit at `share`, written under `paths.trees` (all but the manifest, which the caller
    completes); each booster's `optimism` is (NE on validation - NE on its fit rows) / NE on
    validation, at the rounds kept."""
    leaves = config.models.leaves
    out = paths.trees
    shutil.rmtree(out, ignore_errors=True)
    (out / "boosters").mkdir(parents=True)
    stats.save(out / "dense_stats.json")
    train, valid = split == "train", split == "validation"
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
        boosters[o] = f.describe()
        if f.booster is not None:
            f.booster.save_model(str(out / "boosters" / f"{o}.txt"), num_iteration=f.best_round)
            boosters[o]["optimism"] = _optimism(f, x, y, fit & labelled, valid & labelled)
    manifest = {"version": VERSION, "params": params, "num_trees": leaves.num_trees, "num_leaves": leaves.num_leaves,
                "fit_share": share, "train_rows": int(train.sum()), "fit_rows": int(fit.sum()),
                "held_out_train_rows": int((train & ~fit).sum()), "validation_rows": int(valid.sum()), "boosters": boosters,
                "features": features.describe()}
    if share < 1.0:
        manifest["fit_rule"] = FIT_RULE
    return manifest


def _optimism(f, x: np.ndarray, y: np.ndarray, fit: np.ndarray, valid: np.ndarray) -> float | None:
    """How much better the booster scores its own fit rows than validation, as a share of the
    validation NE (None without validation rows of both classes)."""
    yv = y[valid]
    if len(yv) == 0 or yv.min() == yv.max():
        return None
    p = lambda rows: f.booster.predict(x[rows], num_iteration=f.best_round)  # noqa: E731
    on_valid = ne(yv, p(valid))
    return round(float((on_valid - ne(y[fit], p(fit))) / on_valid), 6)


def leaf_ids(paths: Paths, x: np.ndarray) -> dict[str, np.ndarray]:
    """Per objective: (rows, trees) int leaf index of each row in each fitted tree (LightGBM pred_leaf)."""
    return {p.stem: np.asarray(lgb.Booster(model_file=str(p)).predict(x, pred_leaf=True), dtype=np.int64).reshape(len(x), -1)
            for p in sorted((paths.trees / "boosters").glob("*.txt"))}


def fit_trees_if_on(config: PlatformConfig, paths: Paths, end: str | None = None,
                    validation_share: float | None = None) -> dict | None:
    """The pipeline's `fit_trees` step for code that trains outside the pipeline (benches,
    notebooks): fit when `models.leaves` names a network (None otherwise), on the run's days."""
    from lattice.models.build import reads_leaves

    if not any(reads_leaves(config, kind) for kind in ("teacher", "student")):
        return None
    return fit_trees(config, paths, end=end, validation_share=validation_share)
