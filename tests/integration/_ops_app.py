"""A uvicorn app factory for test_serving_ops.py: the real app (`create_app`: middleware,
prediction log, /metrics) around a stand-in server (fixed-score model, stub online store), so
that real uvicorn workers can be started, counted and stopped without a trained model.

`uvicorn _ops_app:app --factory`, with LATTICE_OPS_TEST_WORKDIR naming the work directory and
LATTICE_OPS_TEST_FLUSH the log's flush interval in seconds."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


class _Model:
    def __init__(self, config):
        self.config = config
        self.info = SimpleNamespace(name="stub", model="student", tags={})
        self.metadata, self.checksum = {}, "abc"

    def predict_columns(self, cols):
        return {o: np.full(len(cols), 0.25) for o in self.config.objective_names}


class _Online:
    mode = "stub"
    entity_keys = ["ad_id", "user_id"]

    def lookup_ids(self, ids):
        return {}, [[] for _ in range(len(ids["user_id"]))]


def app():
    from lattice.config import load_config
    from lattice.paths import Paths
    from lattice.serving.app import Server, create_app
    from lattice.serving.requests import RequestSchema
    from lattice.serving.slot import ModelSlot

    config = load_config(ROOT / "configs" / "demo.yaml")
    log = config.monitoring.prediction_log.model_copy(update={"flush_seconds": float(os.environ["LATTICE_OPS_TEST_FLUSH"])})
    config = config.model_copy(update={"monitoring": config.monitoring.model_copy(update={"prediction_log": log})})
    server = Server.__new__(Server)
    server.config, server.paths, server.schema = config, None, RequestSchema(config)
    model = _Model(config)
    server.slot = ModelSlot(lambda: 5, lambda version: model, poll_seconds=3600)
    server.online = _Online()
    return create_app(config, Paths(workdir=Path(os.environ["LATTICE_OPS_TEST_WORKDIR"]), data_root=ROOT), server=server)
