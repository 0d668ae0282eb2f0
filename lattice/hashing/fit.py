"""Stage `hashing_fit` (`lattice hashing fit CONFIG`): fit the id -> row maps of every sparse
feature whose hashing needs one (vocab, mixed, learned) on the training split of the table
training reads (`find_table`: the training set, else the consolidated examples), one map per row
budget some model of the config uses for the feature, saved under `paths.hashing`. With
`training.window` the training split is the window's train days (`end`), as for the teacher: the
pipeline runs this step first in the teacher's DAG, on the teacher's interval.

Spark does the pass over the table (one aggregation for the window, one per feature column);
the maps are built on the driver from the per-id counts, which are a row per distinct id.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from lattice.config import PlatformConfig
from lattice.hashing.budgets import fit_keys, needs_fit, row_budgets
from lattice.paths import Paths

log = logging.getLogger("lattice.hashing")


def fit_hashing(config: PlatformConfig, paths: Paths, master: str | None = None, seed: int = 0,
                progress: Callable[[str, dict[int, dict[str, Any]]], None] | None = None, end: str | None = None,
                data_end: str | None = None, validation_share: float | None = None) -> dict[str, Any]:
    """Fit and save the maps; returns {"table", "window", "days", "features": {name: {budget: stats}},
    "timings" (seconds per phase), "seconds"}.
    `progress(feature, {budget: fitted map})` is called as each feature is saved (the CLI prints it).
    `end` / `data_end` / `validation_share`: a windowed run's interval end and held-out share of its
    newest day, as `train` takes them: the maps fit on the window's train rows only (the stored
    split marks rows of every day train, the window's validation and test days included, and
    `learned` clusters ids by their labels). The fit records the window; training refuses maps of
    another one (`lattice.hashing.store.check_window`)."""
    from lattice.data.loader import find_table
    from lattice.data.window import fit_days
    from lattice.hashing import id_stats, maps
    from lattice.hashing.store import save_fitted, table_fingerprint
    from pipelines.spark import get_spark

    t0 = time.perf_counter()
    need = needs_fit(config)
    if not need:
        return {"features": {}, "seconds": 0.0, "note": "no sparse feature uses vocab, mixed or learned hashing"}
    table = find_table(paths)
    run = fit_days(config, table, end or data_end, validation_share)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    spark = get_spark(master, app_name="lattice-hashing", config=config)
    timings["spark_session"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    df, split_column = id_stats.train_frame(spark, config, table, run.splits)
    window = id_stats.window_of(df, config, split_column)
    fingerprint = {**table_fingerprint(table, window.rows), "window": run.record}
    timings["window"] = round(time.perf_counter() - t, 3)
    cache: dict[tuple[str, bool], id_stats.IdStats] = {}
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for f in need:
        key = (f.column, f.hashing == "learned")
        if key not in cache:  # features reading one column share its pass
            cache[key] = id_stats.id_stats(df, config, f.column, with_labels=key[1])
            timings[f"counts:{f.column}"] = round(cache[key].seconds, 3)
        stats = cache[key]
        fits = {}
        for budget in row_budgets(config, f):
            t = time.perf_counter()
            fitted = maps.build_map(f, budget, stats, window, seed=seed)
            fitted["stats"]["seconds"] = round(stats.seconds + time.perf_counter() - t, 3)
            fits[budget] = fitted
            timings[f"map:{f.name}:{budget}"] = round(time.perf_counter() - t, 3)
        save_fitted(paths, f.name, fits, {**fingerprint, "keys": fit_keys(f), "seed": seed})
        out[f.name] = {r: {"scheme": m["scheme"], "table_rows": m["table_rows"], "version": m["version"], **m["stats"]}
                       for r, m in fits.items()}
        log.info("hashing fit %s: %s", f.name, out[f.name])
        if progress:
            progress(f.name, fits)
    return {"table": str(table), "hashing": str(paths.hashing),
            "window": {"split": "train", "rows": window.rows, "start": window.start, "end": window.end},
            "days": run.record, "features": out, "timings": timings, "seconds": round(time.perf_counter() - t0, 3)}
