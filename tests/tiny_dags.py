"""Tiny copies of a platform config for smoke runs of the DAGs in tests:
same domains, objectives, sources and schedules, with small synthetic data, small models and one
epoch, and every folder pointed somewhere disposable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

TEACHER = {"embedding_dim": 8, "num_layers": 1, "num_tokens": 4, "fm_rank": 2, "head_dims": [16],
           "domain_token": True, "domain_untied": False}
STUDENT = {"embedding_dim": 4, "table_scale": 0.5, "num_layers": 1, "num_tokens": 2, "fm_rank": 2, "head_dims": [8],
           "domain_token": True}


def tiny(data: dict[str, Any], *, data_root: Path, workdir: Path, name: str | None = None) -> dict[str, Any]:
    data = dict(data)
    if name:
        data["name"] = name
    data["data_root"] = str(Path(data_root).resolve())
    data["workdir"] = str(Path(workdir).resolve())
    data["features"] = dict(data["features"])
    data["features"]["sparse"] = [{**f, "num_embeddings": min(f.get("num_embeddings", 100_000), 4096)}
                                  for f in data["features"]["sparse"]]
    # no leaf features (on by default): DAG tests that run a model task alone would need a
    # `fit_trees` run first; the demo's end-to-end test runs them
    data["models"] = {"teacher": TEACHER, "student": STUDENT,
                      "baselines": {"separate": False, "pooled": False, "multitask": "none"}, "leaves": {"models": []}}
    data["training"] = {**data.get("training", {}), "batch_size": 512, "epochs": 1, "nproc": 1}
    if data.get("synthetic") is not None:
        data["synthetic"] = {**data["synthetic"], "users": 2000, "ads": 500, "chunk_rows": 5000, "rows": 6000}
    for d in data["domains"]:
        d["min_rows"] = min(d.get("min_rows", 1), 10)
    return data


def with_new_domain_and_objective(data: dict[str, Any], *, domain: str = "search_mirror",
                                  objective: str = "deep_click") -> dict[str, Any]:
    """Add one domain (a second surface logged in the search schema) and one objective (a click on
    an active user's feed impression) purely by config, the way a platform user would."""
    data = dict(data)
    new = {"name": domain, "description": "Second surface with the search log schema", "min_rows": 10}
    data["domains"] = [*data["domains"], new]
    search = next(s for s in data["sources"] if s["domain"] == "search")
    mirror = {**search, "name": f"{domain}_log", "domain": domain}
    mirror.pop("truth", None)
    sources = []
    for s in data["sources"]:
        if s["domain"] == "feed":
            s = {**s, "labels": {**s["labels"], objective: {"expr": "clicked = 1 AND user_activity > 0"}}}
        sources.append(s)
    data["sources"] = [*sources, mirror]
    objectives = []
    for o in data["objectives"]:
        o = dict(o)
        if set(o["domains"]) >= {"search"}:
            o["domains"] = [*o["domains"], domain]
        objectives.append(o)
    objectives.append({"name": objective, "loss_weight": 1.0, "domains": ["feed"]})
    data["objectives"] = objectives
    return data


def write_tiny_config(source: Path, folder: Path, *, data_root: Path, workdir: Path, name: str | None = None,
                      new_domain_and_objective: bool = False, overrides: dict[str, Any] | None = None) -> Path:
    """Write a tiny copy of `source` into `folder` (as `<name>.yaml`) and return its path;
    `overrides` replaces top-level sections (e.g. {"feature_store": {...}})."""
    data = tiny(yaml.safe_load(Path(source).read_text()), data_root=data_root, workdir=workdir, name=name)
    data.update(overrides or {})
    if new_domain_and_objective:
        data = with_new_domain_and_objective(data)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{data['name']}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out
