"""The `register` stage: log one trained model (teacher, student or baseline) to MLflow and
register it as a new model version; a student becomes the `challenger`."""

from __future__ import annotations

import json
import logging
import re
import tempfile
from pathlib import Path
from typing import Any

from lattice.config import PlatformConfig
from lattice.paths import Paths
from lattice.registry.checksum import sha256_path, size_mb
from lattice.registry.client import MANIFEST_TAG, SERVABLE, ModelRegistry, flatten
from lattice.registry.plots import cell_bars, history_curves

log = logging.getLogger(__name__)

_METRIC_NAME = re.compile(r"[^A-Za-z0-9_\-./ ]")


def numeric_leaves(prefix: str, value: Any, out: dict[str, float] | None = None) -> dict[str, float]:
    """metrics.json (any nesting) -> {"a.b.c": float} with MLflow-safe names."""
    out = {} if out is None else out
    if isinstance(value, dict):
        for k, v in value.items():
            numeric_leaves(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, bool):
        out[_METRIC_NAME.sub("_", prefix)] = float(value)
    elif isinstance(value, (int, float)):
        out[_METRIC_NAME.sub("_", prefix)] = float(value)
    return out


def per_cell(metrics: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Find {"domain/objective": {"ne":..,"auc":..}} in a metrics.json, whichever way it nests
    cells ({"cells": {d: {o: {...}}}}, {"cells": {"d/o": {...}}} or a list of records)."""
    cells = metrics.get("cells", metrics.get("per_cell", {}))
    out: dict[str, dict[str, float]] = {}
    if isinstance(cells, list):
        for r in cells:
            out[f"{r['domain']}/{r['objective']}"] = {k: v for k, v in r.items() if isinstance(v, (int, float))}
    elif isinstance(cells, dict):
        for k, v in cells.items():
            if isinstance(v, dict) and "ne" in v:
                out[str(k).replace("|", "/")] = v
            elif isinstance(v, dict):
                for o, m in v.items():
                    if isinstance(m, dict):
                        out[f"{k}/{o}"] = m
    return out


def feature_service(config: PlatformConfig, paths: Paths, version: int, model: str) -> str:
    """Apply the Feast FeatureService of this registered version (named after it: see
    `features.repo.feature_service_name`) and return its name; "" for a config without
    aggregates (the model reads no feature of the store)."""
    if not config.features.aggregates:
        return ""
    from features.repo import apply_feature_service
    from features.store import get_store

    return apply_feature_service(config, paths, get_store(config, paths), version, model)


def register(config: PlatformConfig, paths: Paths, model: str = SERVABLE, challenger: bool = True) -> dict:
    model_dir = paths.model_dir(model)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"no trained model at {model_dir}; run `lattice train` (or `lattice distill`) for {model!r} first")
    metrics_file = model_dir / "metrics.json"
    metrics = json.loads(metrics_file.read_text()) if metrics_file.exists() else {}
    export_dir = model_dir / "export"
    checksum = sha256_path(export_dir if export_dir.is_dir() else model_dir)
    tags = {
        "lattice.config": config.name,
        "lattice.checksum": checksum,
        "lattice.exported": str(export_dir.is_dir()).lower(),
    }
    if export_dir.is_dir():
        tags["lattice.artifact_mb"] = f"{size_mb(export_dir):.3f}"
    from lattice.training.lineage import read as read_lineage, tags as lineage_tags

    tags.update(lineage_tags(read_lineage(model_dir)))  # parent, days seen, judged-on day
    meta = export_dir / "metadata.json"
    if meta.exists():
        tags["lattice.trained_at"] = str(json.loads(meta.read_text()).get("trained_at", ""))
    params = flatten("", config.model_dump(mode="json"))
    extras: dict[str, Path] = {}
    with tempfile.TemporaryDirectory() as tmp:
        plots = Path(tmp) / "plots"
        cell_bars(per_cell(metrics), model, plots / "cells.png")
        hist = model_dir / "history.json"
        if hist.exists():
            h = json.loads(hist.read_text())
            history_curves(h if isinstance(h, list) else h.get("epochs", []), model, plots / "history.png")
        if plots.is_dir():
            extras["plots"] = plots
        cfg_file = Path(tmp) / "config.json"
        cfg_file.write_text(json.dumps(config.model_dump(mode="json"), indent=2))
        extras["config"] = cfg_file
        hash_tables = paths.workdir / "hashing"
        if hash_tables.is_dir():
            extras["hash_tables"] = hash_tables
        reg = ModelRegistry(config, paths)
        version = reg.log_model(model, model_dir, params=params, metrics=numeric_leaves("", metrics), tags=tags, extra_artifacts=extras)
    # the version number exists only now: its FeatureService is applied and recorded on it
    # a subset run's version numbers count in its own registered model: its own FeatureService name
    variant = getattr(paths, "variant", None)
    service = feature_service(config, paths, version.version, model if variant is None else f"{model}__{variant}")
    reg.client.set_model_version_tag(version.name, str(version.version), "lattice.feature_service", service)
    version = reg.version(version.version, model=model)
    servable = reg.registered_name(model) == reg.base_name
    if servable and challenger:
        reg.set_challenger(version)
    summary = {
        "model": model, "registered_model": version.name, "version": version.version, "run_id": version.run_id,
        "checksum": checksum, "manifest": version.tags.get(MANIFEST_TAG), "feature_service": service,
        "challenger": servable and challenger,
        "tracking_uri": reg.tracking_uri,
    }
    log.info("register: %s", summary)
    return summary
