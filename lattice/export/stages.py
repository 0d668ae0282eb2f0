"""The `export` stage: trained model -> TorchScript artifact folder `<model dir>/export/`,
checked by loading it back and comparing its predictions with the training model's."""

from __future__ import annotations

import datetime as dt
import json
import logging
import shutil
import time

import numpy as np
import torch

from lattice.config import PlatformConfig
from lattice.paths import Paths
from lattice.registry.checksum import sha256_path, size_mb

log = logging.getLogger(__name__)

CHECK_ROWS = 4096


def _calibration_meta(maps: dict | None) -> dict | None:
    if not maps:
        return None
    return {"method": maps.get("method"), "cells": {c: m.get("method") for c, m in maps.get("cells", {}).items()}}


def export_model(config: PlatformConfig, paths: Paths, model: str = "student", int8: bool | None = None) -> dict:
    from lattice.export.predictor import Predictor
    from lattice.export.serving_module import script
    from lattice.export.trained import load_trained
    from lattice.export.window import latency_ms, load_window

    int8 = config.promotion.int8_embeddings if int8 is None else int8
    src = paths.model_dir(model)
    trained = load_trained(src)
    out = src / "export"
    tmp = src / "export.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    started = time.perf_counter()
    scripted = script(trained.model, int8=int8)
    scripted.save(str(tmp / "model.pt"))
    (tmp / "config.json").write_text(json.dumps(trained.blob["config"], indent=1, default=str))
    forest = trained.model.leaf_forest
    if forest is not None:
        # the tree part: LightGBM beside the TorchScript module computes the leaf ids from the raw
        # request (lattice.trees.leaves; docs/bench/tree-leaves.md for why not a compiled form)
        from lattice.trees.leaves import TREES_FILE

        (tmp / TREES_FILE).write_text(forest.to_json())
    meta = {
        "config": trained.config.name, "model": model, "kind": trained.blob["kind"], "n_dense": trained.blob["n_dense"],
        "dense_stats": trained.blob["dense_stats"], "objectives": trained.config.objective_names,
        "domains": trained.config.domain_names, "int8_embeddings": int8, "format": "torchscript",
        "trained_at": dt.datetime.fromtimestamp(trained.path.stat().st_mtime, dt.timezone.utc).isoformat(timespec="seconds"),
        "exported_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "source_checksum": sha256_path(trained.path), "torch": torch.__version__, "cost": trained.blob.get("cost"),
        "fp8_sites": {s["site"]: s["choice"] for s in (trained.blob.get("fp8") or {}).get("sites", []) if s["choice"] != "fp32"},
        # per sparse feature: its hashing scheme and the versions of the fitted id maps inside the artifact
        # the calibration stage the artifact applies (it is inside model.pt): method and per-cell map
        "calibration": _calibration_meta(trained.blob.get("calibration")),
        # parent (warm start), days seen, the day it was judged on (lattice.training.lineage)
        "lineage": trained.blob.get("lineage"),
        # the tree fit whose leaf ids the model reads, computed by LightGBM in the predictor (trees.json)
        "leaves": forest.fit if forest is not None else None,
        "embeddings": {f.name: {"hashing": f.hashing, "fits": {str(r): m.get("version") for r, m in
                                                               (trained.blob.get("hashing") or {}).get(f.name, {}).items()}}
                       for f in trained.config.features.sparse},
    }
    (tmp / "metadata.json").write_text(json.dumps(meta, indent=1, default=str))

    # load-and-compare: the artifact, loaded as serving loads it, against the eager training model
    loaded = Predictor.load(tmp)
    window = load_window(config, paths, "test", max_rows=CHECK_ROWS)
    batch = loaded.encode(window)
    got = loaded.predict_batch(batch)
    with torch.no_grad():
        want = {o: torch.sigmoid(v).numpy() for o, v in trained.model(batch.dense, batch.sparse, batch.domain).items()}
    diff = max(float(np.max(np.abs(got[o] - want[o]))) for o in want)
    lat = latency_ms(loaded, window)
    check = {"rows": int(len(window)), "max_abs_diff": diff, "latency_single_p50_ms": lat["p50_ms"],
             "latency_single_p99_ms": lat["p99_ms"], "artifact_mb": size_mb(tmp)}
    (tmp / "check.json").write_text(json.dumps(check, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    summary = {"model": model, "artifact": str(out), "int8_embeddings": int8, "checksum": sha256_path(out),
               "seconds": round(time.perf_counter() - started, 2), **check}
    log.info("export: %s", summary)
    return summary


def export_stage(config: PlatformConfig, paths: Paths, model: str = "student", int8: bool | None = None) -> dict:
    return export_model(config, paths, model, int8)
