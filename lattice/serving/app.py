"""The FastAPI app: POST /predict, GET /healthz, GET /metadata.

    request(s) --validate--> entity keys --Feast online store--> aggregate features
               --frame in the training-set layout--> champion artifact --> p(objective)

The champion is whatever version the registry alias `champion` names; a watcher thread swaps in
a new one when the alias moves (see slot.py).
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
import msgspec
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from lattice.config import PlatformConfig
from lattice.paths import Paths
from lattice.serving.frame import request_columns
from lattice.serving.online import OnlineFeatures
from lattice.serving.requests import (BatchRequest, PredictRequest, PredictResponse, RequestError, RequestSchema, WireBatch,
                                      WireRequest)
from lattice.serving.slot import ModelSlot

log = logging.getLogger(__name__)


def _validation_message(exc: ValidationError, prefix: str = "") -> list[str]:
    out = []
    for e in exc.errors():
        loc = prefix + ".".join(str(p) for p in e["loc"] if not str(p).startswith(("function-", "union[")))
        kind = e["type"]
        if kind == "extra_forbidden":
            msg = "unknown field; allowed fields are domain, entities, features, request_id (or 'requests': [...] for a batch)"
        elif kind == "missing":
            msg = "required field is missing"
        else:
            msg = e["msg"]
        out.append(f"{loc or '<body>'}: {msg} (got {e.get('input')!r})" if kind != "missing" else f"{loc}: {msg}")
    return list(dict.fromkeys(out))


def _parse_slow(raw: bytes) -> tuple[list[PredictRequest], bool]:
    """The pydantic path: writes the readable message for a body the fast decoder rejected."""
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise RequestError(None, f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(None, "body must be a JSON object: {domain, entities, features} or {requests: [...]}")
    try:
        if "requests" in body:
            return BatchRequest.model_validate(body).requests, True
        return [PredictRequest.model_validate(body)], False
    except ValidationError as exc:
        raise RequestError(None, "; ".join(_validation_message(exc))) from None


def parse_body(raw: bytes, schema: RequestSchema) -> tuple[list, bool]:
    """Body -> (requests, is_batch); raises RequestError with a readable message.

    msgspec decodes and type-checks a valid body (a 256-request batch in well under a
    millisecond); whatever it rejects is parsed again by the pydantic models, which say what
    is wrong in the API's own terms."""
    try:
        body = msgspec.json.decode(raw)
        if isinstance(body, dict) and "requests" in body:
            reqs, batch = msgspec.convert(body, WireBatch).requests, True
        else:
            reqs, batch = [msgspec.convert(body, WireRequest)], False
    except (msgspec.DecodeError, msgspec.ValidationError):
        reqs, batch = _parse_slow(raw)  # raises with the message (or accepts what msgspec would not)
    schema.check_all(reqs, batch)
    return reqs, batch


class Server:
    """Everything one app instance holds: config, registry, the model slot and the online store."""

    def __init__(self, config: PlatformConfig, paths: Paths, poll_seconds: float = 2.0):
        from lattice.registry import CHAMPION, ModelRegistry
        from lattice.export.predictor import Predictor

        self.config = config
        self.paths = paths
        self.schema = RequestSchema(config)
        self.registry = ModelRegistry(config, paths)

        def current() -> int | None:
            v = self.registry.by_alias(CHAMPION)
            return v.version if v else None

        def load(version: int) -> Predictor:
            info = self.registry.version(version)
            return Predictor.load(self.registry.download(info), version=info)

        self.slot: ModelSlot[Predictor] = ModelSlot(current, load, poll_seconds=poll_seconds)
        self.online = OnlineFeatures(config, paths)
        if config.features.aggregates:
            self.online.open()

    def score(self, reqs: list) -> dict[str, Any]:
        """Requests -> the response body (`PredictResponse`'s layout) as plain Python values."""
        served = self.slot.current  # read once: this request sees one whole model
        if served is None:
            raise LookupError("no champion model is loaded yet")
        cols = request_columns(served.model.config, reqs, {})
        # the ids hashed for the model are the keys of the online lookup: hash once
        aggregates, unknown = self.online.lookup_ids({k: cols.sparse[k][0] for k in self.online.entity_keys})
        cols.dense.update(aggregates)
        probs = served.model.predict_columns(cols)
        names = list(probs)
        rows = zip(*(probs[o].tolist() for o in names))  # python floats, one conversion per objective
        preds = [
            {"request_id": r.request_id, "domain": r.domain, "probabilities": dict(zip(names, p)), "unknown_entities": u}
            for r, p, u in zip(reqs, rows, unknown)
        ]
        return {"model_version": served.version, "predictions": preds}


def create_app(config: PlatformConfig, paths: Paths, poll_seconds: float = 2.0) -> FastAPI:
    server_box: dict[str, Server] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server = await run_in_threadpool(Server, config, paths, poll_seconds)
        await run_in_threadpool(server.slot.refresh)
        server.slot.start()
        server_box["s"] = server
        app.state.server = server
        try:
            yield
        finally:
            server.slot.stop()

    app = FastAPI(title=f"Lattice {config.name} ranking", lifespan=lifespan)

    @app.post("/predict", response_model=PredictResponse)
    async def predict(request: Request) -> Any:
        server = server_box["s"]
        raw = await request.body()
        try:
            reqs, _ = parse_body(raw, server.schema)
        except RequestError as exc:
            return JSONResponse(status_code=422, content={"detail": str(exc)})
        try:
            # Scored on the event loop, not in a worker thread: the work is CPU-bound under the
            # GIL either way, and the thread hand-off cost more than a single row's lookup and
            # forward. The response is serialised once here by msgspec (the route's
            # response_model only documents it), instead of FastAPI validating it again.
            body = server.score(reqs)
        except LookupError as exc:
            return JSONResponse(status_code=503, content={"detail": str(exc)})
        return Response(content=msgspec.json.encode(body), media_type="application/json")

    @app.get("/healthz")
    async def healthz() -> Any:
        server = server_box["s"]
        served = server.slot.current
        body = {
            "status": "ok" if served else "no_model",
            "model_version": served.version if served else None,
            "swaps": server.slot.swaps,
            "last_error": server.slot.last_error,
            "online_features": server.online.mode,
        }
        return JSONResponse(status_code=200 if served else 503, content=body)

    @app.get("/metadata")
    async def metadata() -> Any:
        server = server_box["s"]
        served = server.slot.current
        if served is None:
            return JSONResponse(status_code=503, content={"detail": "no champion model is loaded yet"})
        info = served.model.info
        return {
            "config": config.name,
            "registered_model": info.name,
            "model_version": served.version,
            "alias": "champion",
            "model": info.model,
            "feature_service": info.tags.get("lattice.feature_service"),
            "training_date": info.tags.get("lattice.trained_at") or served.model.metadata.get("trained_at"),
            "checksum": info.tags.get("lattice.checksum"),
            "objectives": config.objective_names,
            "domains": config.domain_names,
            "loaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(served.loaded_at)),
        }

    return app
