"""Every platform stage by name. A stage is a plain function `stage(config, paths, **params) -> dict`
(a JSON-able summary); the CLI, the tests and the Airflow tasks all call stages through here.
Imports are lazy so that DAG files parse fast and never pull torch or Spark."""

from __future__ import annotations

import importlib
from typing import Any, Callable

# name -> "module:function". Only stages that exist are listed.
STAGES: dict[str, str] = {
    "synth": "lattice.data.synth_stage:synth",
    "train": "lattice.training.stages:train",
    "train_gbdt": "lattice.training.gbdt_stage:train_gbdt",
    "score": "lattice.training.stages:score_stage",
    "evaluate": "lattice.evaluation.stages:evaluate",
    "distill": "lattice.distill.stages:distill",
    "export": "lattice.export.stages:export_stage",
    "register": "lattice.registry.stages:register",
    "promote": "lattice.promotion.stages:promote",
    # the DAGs' split of promote: the decision (a reject is a result), then its move
    "gate": "lattice.promotion.stages:gate",
    "apply_gate": "lattice.promotion.stages:apply_gate",
    "rollback": "lattice.promotion.stages:rollback",
    "predict": "lattice.scoring.batch:predict_file",
    # the feature pipeline (Spark + Great Expectations + Feast); "features" runs the whole chain
    "features": "pipelines.stages:run_features",
    "consolidate": "pipelines.consolidate:ingest_and_consolidate",
    "aggregates": "pipelines.aggregates:build_aggregates",
    "feast_apply": "pipelines.feast_jobs:feast_apply",
    "training_set": "pipelines.feast_jobs:build_training_set",
    "materialize": "pipelines.feast_jobs:materialize",
    # id maps of the vocab / mixed / learned hashing schemes, fitted on the training split
    "hashing_fit": "lattice.hashing.fit:fit_hashing",
    # the boosters whose leaf ids feed the models that read them (models.leaves), on the training split
    "trees_fit": "lattice.trees.fit:fit_trees",
    # hyperparameter search on the validation split (Optuna study under <workdir>/tune/)
    "tune": "lattice.tuning.stages:tune",
    # the served model's health: the prediction log joined with the labels that arrived, rules
    "monitor": "lattice.monitoring.stage:monitor",
    # report.html rewritten for the registry's current champion (read-only on models and registry)
    "report": "lattice.evaluation.champion_report:report",
}


def get_stage(name: str) -> Callable[..., dict[str, Any]]:
    try:
        target = STAGES[name]
    except KeyError:
        raise KeyError(f"unknown stage {name!r}; known stages: {sorted(STAGES)}") from None
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def run_stage(name: str, config, paths, **params) -> dict[str, Any]:
    return get_stage(name)(config, paths, **params)
