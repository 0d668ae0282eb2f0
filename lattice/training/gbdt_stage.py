"""Stage `train_gbdt`: the LightGBM baselines `gbdt` (one booster per objective over every domain)
and `gbdt_cell` (one booster per (domain, objective) cell).

Same split, features and metrics as every deep model: the table's `split` column (or, with
`training.window`, the run's days: lattice.data.window, the rule the deep models' loader applies), the dense
stats fitted on the train split (lattice.data.loader.fit_dense_stats), the RowEncoder arrays and
`cell_metrics` on the test split. Each booster fits on the train rows where its objective is
labelled (mask > 0) and stops early on the validation rows; the test rows are only scored.
Outputs in `paths.model_dir(model)`, in the layout every model has: metrics.json,
predictions.parquet (test split: example_id, domain, p_/label_/mask_/truth_<objective>),
history.json (validation log loss per round of each booster), summary.json; plus
boosters/<key>.txt (LightGBM model files), encodings.npz and dense_stats.json.
"""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pandas as pd

from lattice.config import PlatformConfig
from lattice.data.loader import RowEncoder, _row_split, find_table, fit_dense_stats, read_unit, scan_units
from lattice.data.transforms import DenseStats
from lattice.evaluation.metrics import cell_metrics
from lattice.models.build import GBDT_KINDS, kind_of
from lattice.models.gbdt import Fitted, TreeFeatures, fit_booster, lgb_params
from lattice.paths import Paths
from lattice.progress import progress_bar
from lattice.training.threads import machine_threads


def read_rows(config: PlatformConfig, table, stats: DenseStats, days=None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every row of the table as RowEncoder arrays (with truth), and its split name ("" for a row
    outside a windowed run's days). The boosters need the rows in memory; `Gbdt.max_train_rows`
    bounds what they fit on. A windowed run's train and validation rows carry the labels known at
    its cutoff, as the deep models' loader gives them (training.label_delay: an impression whose
    attribution window is still open is masked); its test rows keep their final labels."""
    from lattice.data import label_time

    enc = RowEncoder(config, stats, with_truth=True)
    cutoff = days.cutoff() if days is not None else None
    delayed = label_time.delayed_objectives(config) if cutoff is not None else []
    extra = ["date", "event_timestamp"] if days is not None else []
    extra += [c for c in label_time.columns_needed(config) if c not in extra] if delayed else []
    parts: list[dict[str, np.ndarray]] = []
    splits: list[np.ndarray] = []
    for unit in scan_units(table):
        tbl, part = read_unit(unit, enc.columns + ["split"] + extra)
        if tbl.num_rows == 0:
            continue
        names = np.full(tbl.num_rows, "", dtype=object)
        for s in ("train", "validation", "test"):
            names[_row_split(config, tbl, part, s, days)] = s  # the deep models' rule: the run's days, else the stored split
        arrs = enc.encode(tbl, part)
        if delayed:  # the labels the run could know when it trains, on the rows it learns and stops on
            _labels_at_cutoff(arrs, label_time.apply_cutoff_arrow(tbl, cutoff, config), delayed,
                              np.isin(names, ("train", "validation")))
        parts.append(arrs)
        splits.append(names)
    arrs = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return arrs, np.concatenate(splits)


def _labels_at_cutoff(arrs: dict[str, np.ndarray], cut, objectives: list[str], rows: np.ndarray) -> None:
    """`arrs`' label and mask of `objectives` on `rows` replaced by the cut table's (the same rows)."""
    from lattice.data import schema as S

    for o in objectives:
        for kind, col in (("label", S.label_column(o)), ("mask", S.mask_column(o))):
            if col in cut.column_names:
                known = np.nan_to_num(cut.column(col).to_numpy(zero_copy_only=False).astype(np.float64))
                arrs[f"{kind}:{o}"] = np.where(rows, known, arrs[f"{kind}:{o}"]).astype(arrs[f"{kind}:{o}"].dtype)


def _fit_rows(split: np.ndarray, cap: int | None, seed: int) -> np.ndarray:
    """Boolean mask of the train rows to fit on: all of them, or a seeded uniform sample."""
    train = split == "train"
    if cap is None or train.sum() <= cap:
        return train
    keep = np.random.default_rng(seed).choice(np.flatnonzero(train), cap, replace=False)
    out = np.zeros(len(split), bool)
    out[keep] = True
    return out


def train_gbdt(config: PlatformConfig, paths: Paths, model: str = "gbdt", seed: int | None = None,
               progress: bool = True, end: str | None = None, data_end: str | None = None) -> dict:
    """Train the LightGBM baseline `model` (`gbdt` or `gbdt_cell`, optionally 'kind@tag'). `end` /
    `data_end`: a windowed run's interval end (training.window), as for the deep models, so the
    boosters fit, stop and are tested on the same days as the teacher they are compared with."""
    kind = kind_of(model)
    if kind not in GBDT_KINDS:
        raise ValueError(f"train_gbdt trains {GBDT_KINDS}, not {model!r}; use the `train` stage")
    started = time.perf_counter()
    settings = config.models.baselines.trees
    seed = config.training.seed if seed is None else seed
    threads = settings.num_threads or machine_threads()
    params = lgb_params(settings, seed, threads)
    table = find_table(paths)
    out = paths.model_dir(model)
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "boosters", ignore_errors=True)
    for stale in ("summary.json", "metrics.json", "predictions.parquet"):
        (out / stale).unlink(missing_ok=True)

    from lattice.data.window import resolve as resolve_window

    window = resolve_window(config, table, end or data_end)
    days = window.splits(validation_share=config.training.window_validation) if window is not None else None  # a booster is never warm-started: every train day
    stats = fit_dense_stats(config, table, days)
    stats.save(out / "dense_stats.json")
    arrs, split = read_rows(config, table, stats, days)
    fit_rows = _fit_rows(split, settings.max_train_rows, seed)
    features = TreeFeatures.fit(config, [c.column for c in stats.columns], arrs, fit_rows, settings.max_categories,
                                with_domain=kind == "gbdt")
    features.save(out / "encodings.npz")
    x = features.matrix(arrs)
    valid, test = split == "validation", split == "test"
    domains = config.domain_names
    rates = stats.label_rates or {}

    # one booster per objective (pooled) or per (domain, objective) cell
    groups = ([(o, None, o) for o in config.objective_names] if kind == "gbdt"
              else [(o, domains.index(d), f"{d}__{o}") for d, o in config.cells()])
    probs = {o: np.full(int(test.sum()), rates.get(o, 0.5)) for o in config.objective_names}
    test_domain, x_test = arrs["domain"][test], x[test]
    fitted: dict[str, Fitted] = {}
    (out / "boosters").mkdir()
    for objective, d, key in progress_bar(groups, desc=f"train {model}", unit="booster", enabled=progress):
        labelled = arrs[f"mask:{objective}"] > 0
        if d is not None:
            labelled &= arrs["domain"] == d
        y = arrs[f"label:{objective}"].astype(np.float64)
        fr, vr = fit_rows & labelled, valid & labelled
        f = fit_booster(params, settings, features, x[fr], y[fr], x[vr], y[vr])
        fitted[key] = f
        if f.booster is not None:
            f.booster.save_model(str(out / "boosters" / f"{key}.txt"), num_iteration=f.best_round)
        scored = np.ones(len(test_domain), bool) if d is None else test_domain == d
        probs[objective][scored] = f.predict(x_test[scored])

    frame: dict[str, np.ndarray] = {"example_id": arrs["example_id"][test],
                                    "domain": np.asarray(domains, dtype=object)[test_domain]}
    for o in config.objective_names:  # the column layout of the torch trainer's predictions
        frame[f"p_{o}"] = probs[o]  # float64: exactly what the boosters return
        frame[f"label_{o}"] = arrs[f"label:{o}"][test]
        frame[f"mask_{o}"] = arrs[f"mask:{o}"][test]
        frame[f"truth_{o}"] = arrs[f"truth:{o}"][test]
    preds = pd.DataFrame(frame).sort_values("example_id", kind="stable").reset_index(drop=True)
    from lattice.data.passthrough import attach

    attach(config, table, preds).to_parquet(out / "predictions.parquet", index=False)
    cost = {"boosters": sum(f.booster is not None for f in fitted.values()),
            "trees": sum(f.best_round for f in fitted.values()), "leaves": sum(f.leaves() for f in fitted.values())}
    metrics = cell_metrics(config, preds)
    metrics.update({"model": model, "kind": kind, "cost": cost, "best_epoch": None, "world_size": 1,
                    "test_examples": int(len(preds))})
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    (out / "history.json").write_text(json.dumps(
        {"boosters": {k: {"valid_logloss": f.valid_logloss, "best_round": f.best_round} for k, f in fitted.items()}}, indent=1))
    summary = {"model": model, "kind": kind, "world_size": 1, "best_epoch": None, "macro": metrics["macro"], "cost": cost,
               "params": params, "max_rounds": settings.max_rounds, "early_stopping_rounds": settings.early_stopping_rounds,
               "fit_rows": int(fit_rows.sum()), "validation_rows": int(valid.sum()), "test_rows": int(test.sum()),
               "features": features.describe(), "boosters": {k: f.describe() for k, f in fitted.items()}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    summary["seconds"] = time.perf_counter() - started
    summary["model_dir"] = str(out)
    return summary
