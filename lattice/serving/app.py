"""The FastAPI app: POST /predict, GET /healthz, GET /metadata, GET /metrics.

    request(s) --validate--> entity keys --Feast online store--> aggregate features
               --frame in the training-set layout--> champion artifact --> p(objective)

The champion is whatever version the registry alias `champion` names; a watcher thread swaps in
a new one when the alias moves (see slot.py).

Bad input gets a 4xx with a message, never a 500: 401 without the token (when
`serving.auth_token_env` names one; checked before the body is read), 413 for a body over
`serving.max_body_bytes` (refused from its Content-Length, or as soon as the stream passes the
limit) or a batch over `serving.max_batch`, 400 for a body that is not UTF-8 or is nested too
deeply, 422 for the rest (see `parse_body` and requests.py); 429 with Retry-After for a client
over its `serving.limits` (requests or rows in flight), 408 for a body slower than
`serving.limits.body_timeout_seconds`. Batches are scored in chunks, the clients taking fair
turns between chunks (fairness.py). Each request is one line on the
`lattice.serving.access` logger (`serving.access_log`). Every scored batch is recorded by
`ServingOps` (ops.py): the prediction log and the Prometheus counters behind `/metrics`, which
is open like /healthz (counts only, no request data).
"""

from __future__ import annotations

import datetime as dt
import hmac
import json
import logging
import math
import os
import re
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
import msgspec
import numpy as np
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from lattice.config import PlatformConfig
from lattice.paths import Paths
from lattice.serving.fairness import (BodyTimeout, BodyTooSlow, ClientLimiter, FairScheduler, Refused, Ticket,
                                      body_timeout_response, client_key)
from lattice.serving.frame import request_columns
from lattice.serving.metrics import MetricsMiddleware
from lattice.serving.online import OnlineFeatures
from lattice.serving.ops import ServingOps
from lattice.serving.requests import (BatchRequest, PredictRequest, PredictResponse, RequestError, RequestSchema, WireBatch,
                                      WireRequest, short)
from lattice.serving.slot import ModelSlot

log = logging.getLogger(__name__)
access_log = logging.getLogger("lattice.serving.access")

_TOO_DEEP = "body is nested too deeply to be a request (a request is at most 4 levels deep)"
# A request is 4 levels deep; past this the body is refused before a decoder recurses into it.
# The decoders' own limit is the interpreter's recursion limit, which a library in the process
# may raise (the 400 then became a 422 only in some processes).
_MAX_DEPTH = 64
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def _too_deep(raw: bytes) -> bool:
    """Bracket depth of the body outside its strings exceeds _MAX_DEPTH (C-speed scans only)."""
    if raw.count(b"[") + raw.count(b"{") <= _MAX_DEPTH:
        return False
    codes = np.frombuffer(_STRING.sub(b"", raw), np.uint8)
    step = np.isin(codes, (ord("["), ord("{"))).astype(np.int32) - np.isin(codes, (ord("]"), ord("}")))
    return bool(len(step)) and int(np.cumsum(step).max()) > _MAX_DEPTH
_MAX_MESSAGES = 5  # a batch with many bad requests: the first few problems, and a count


class ServingStartupError(RuntimeError):
    """The server cannot start as configured (e.g. the token variable is not set)."""


def _validation_message(exc: ValidationError, prefix: str = "") -> list[str]:
    out = []
    for e in exc.errors():
        loc = prefix + ".".join(str(p) for p in e["loc"] if not str(p).startswith(("function-", "union[")))
        loc = loc if len(loc) <= 200 else loc[:200] + "..."  # a field name is the client's text too
        kind = e["type"]
        if kind == "extra_forbidden":
            msg = "unknown field; allowed fields are domain, entities, features, request_id, passthrough (or 'requests': [...] for a batch)"
        elif kind == "missing":
            msg = "required field is missing"
        else:
            msg = e["msg"]
        out.append(f"{loc or '<body>'}: {msg} (got {short(e.get('input'))})" if kind != "missing" else f"{loc}: {msg}")
    out = list(dict.fromkeys(out))
    if len(out) > _MAX_MESSAGES:
        out = out[:_MAX_MESSAGES] + [f"... and {len(out) - _MAX_MESSAGES} more problem(s)"]
    return out


def _check_batch_size(body: dict, max_batch: int) -> None:
    """413 for a batch over `serving.max_batch`, before any of its requests is looked at."""
    reqs = body.get("requests")
    if type(reqs) is list and len(reqs) > max_batch:
        raise RequestError(None, f"batch of {len(reqs)} requests is over the limit of {max_batch} "
                                 f"(serving.max_batch); split it into smaller batches", status=413)


def _has_lone_surrogate(body) -> bool:
    """Python's json decodes an unpaired `\\ud800` escape (msgspec refuses it): such a string
    cannot be hashed as an id or written back in a response."""
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _parse_slow(raw: bytes, max_batch: int) -> tuple[list[PredictRequest], bool]:
    """The pydantic path: writes the readable message for a body the fast decoder rejected."""
    try:
        text = raw.decode("utf-8")  # JSON is UTF-8 (RFC 8259), as the fast decoder reads it
    except UnicodeDecodeError as exc:
        raise RequestError(None, f"body is not UTF-8 text (byte {exc.start} is {raw[exc.start:exc.start + 1]!r}); "
                                 "send JSON encoded as UTF-8", status=400) from None
    if _too_deep(raw):
        raise RequestError(None, _TOO_DEEP, status=400)
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(None, f"body is not valid JSON: {exc}") from None
    except ValueError:  # an integer literal over Python's digit limit (4300)
        raise RequestError(None, "body holds a number too long to read (thousands of digits)", status=400) from None
    if "\\u" in text and _has_lone_surrogate(body):
        raise RequestError(None, "body is not valid Unicode: a \\u escape in it is half of a UTF-16 surrogate pair",
                           status=400)
    if not isinstance(body, dict):
        raise RequestError(None, "body must be a JSON object: {domain, entities, features} or {requests: [...]}")
    try:
        if "requests" in body:
            _check_batch_size(body, max_batch)
            return BatchRequest.model_validate(body).requests, True
        return [PredictRequest.model_validate(body)], False
    except ValidationError as exc:
        raise RequestError(None, "; ".join(_validation_message(exc))) from None


def parse_body(raw: bytes, schema: RequestSchema) -> tuple[list, bool]:
    """Body -> (requests, is_batch); raises RequestError with a readable message and its status.

    msgspec decodes and type-checks a valid body (a 256-request batch in well under a
    millisecond); whatever it rejects is parsed again by the pydantic models, which say what
    is wrong in the API's own terms."""
    reqs, batch, checked = decode_body(raw, schema)
    if not checked:
        schema.check_all(reqs, batch)
    return reqs, batch


def decode_body(raw: bytes, schema: RequestSchema) -> tuple[list, bool, bool]:
    """`parse_body` without the per-request rules on the fast path: (requests, is_batch, checked).
    When `checked` is false the caller applies `schema.check_all` (the server does it in
    chunk-sized pieces, each a fair turn: on a 1,024-row batch it costs more than decoding)."""
    try:
        try:
            body = msgspec.json.decode(raw)
            if isinstance(body, dict) and "requests" in body:
                _check_batch_size(body, schema.max_batch)
                reqs, batch = msgspec.convert(body, WireBatch).requests, True
            else:
                reqs, batch = [msgspec.convert(body, WireRequest)], False
        except (msgspec.DecodeError, msgspec.ValidationError):
            # raises with the message, or accepts what msgspec would not (then checked for what
            # the wire structs refuse by decoding: ints outside int64, NaN and infinities)
            reqs, batch = _parse_slow(raw, schema.max_batch)
            schema.check_all(reqs, batch, values=True)
            return reqs, batch, True
    except RecursionError:  # both decoders stop at the interpreter's recursion limit
        raise RequestError(None, _TOO_DEEP, status=400) from None
    return reqs, batch, False


LOGGED_AT_HEADER = "X-Lattice-Logged-At"


def replayed_time(value: str | None, replay_clock: bool) -> float | None:
    """The `X-Lattice-Logged-At` header -> epoch seconds (None: absent). An ISO 8601 time (a
    naive one is UTC) or epoch seconds; 400 when malformed, or when the server was not started
    with `--replay-clock`."""
    if value is None:
        return None
    if not replay_clock:
        raise RequestError(None, status=400, message=f"{LOGGED_AT_HEADER} is taken only by a server started with `lattice serve --replay-clock` "
                                 "(a replay of past traffic); a live server logs its own time: drop the header")
    text = value.strip()
    bad = RequestError(None, status=400, message=f"{LOGGED_AT_HEADER}: {value!r} is not a time; send ISO 8601 "
                                                 "(2026-01-12T12:00:00Z) or epoch seconds")
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise bad from None
        return (when if when.tzinfo is not None else when.replace(tzinfo=dt.timezone.utc)).timestamp()
    if not math.isfinite(seconds):  # float() reads "nan" and "inf": no hour to log them in
        raise bad
    return seconds


# A body up to this size is parsed without a fair turn of its own (fairness between clients,
# `_parse_fairly`): a few rows, well under a millisecond to decode and check.
_TURNLESS_BODY_BYTES = 8192


def _auth_token(env_name: str | None) -> bytes | None:
    """The token `serving.auth_token_env` names, read once at startup; None: no authentication."""
    if env_name is None:
        return None
    token = os.environ.get(env_name, "").strip()
    if not token:
        raise ServingStartupError(
            f"serving.auth_token_env is {env_name!r} but the environment variable {env_name} is "
            f"{'empty' if env_name in os.environ else 'not set'}: export it with the token clients must send "
            "(Authorization: Bearer <token> or X-API-Key: <token>), or remove serving.auth_token_env to serve "
            "without authentication")
    return token.encode()


_AUTH_HINT = "send 'Authorization: Bearer <token>' or 'X-API-Key: <token>'"


def _header(request: Request, name: bytes) -> bytes | None:
    """One raw header value (ASGI names are lower-case bytes), without building Starlette's
    `Headers`: the checks below run on every request."""
    for key, value in request.scope["headers"]:
        if key == name:
            return value
    return None


def _credentials_problem(request: Request, token: bytes) -> str | None:
    """Why this request is not authorized, or None. Either header may carry the token; each
    candidate is compared, as the bytes the client sent, in constant time."""
    given = []
    key = _header(request, b"x-api-key")
    if key is not None:
        given.append(key.strip())
    auth = _header(request, b"authorization")
    if auth is not None:
        scheme, _, value = auth.strip().partition(b" ")
        if scheme.lower() == b"bearer":
            given.append(value.strip())
        elif key is None:
            return f"unsupported Authorization scheme; {_AUTH_HINT}"
    if not given:
        return f"missing credentials; {_AUTH_HINT}"
    ok = False
    for g in given:
        ok |= hmac.compare_digest(g, token)
    return None if ok else "invalid token"


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) from its Content-Length or as soon as the stream passes `limit`."""
    length = _header(request, b"content-length")
    if length is not None:
        try:
            declared = int(length)
        except ValueError:
            raise RequestError(None, f"Content-Length {short(length)} is not a number", status=400) from None
        if declared > limit:
            raise RequestError(None, f"body of {declared} bytes is over the limit of {limit} bytes "
                                     "(serving.max_body_bytes); send smaller batches", status=413)
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(None, f"body is over the limit of {limit} bytes (serving.max_body_bytes); "
                                     "send smaller batches", status=413)
        chunks.append(chunk)
    return b"".join(chunks)


class AccessLog:
    """ASGI middleware: one `lattice.serving.access` line per HTTP request, written when the
    response has been sent: method, path, status, duration in ms, batch size (/predict; the route
    leaves it in the scope) and client address. No bodies, query strings or headers."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 500  # what the client gets when the app raises before responding

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            if access_log.isEnabledFor(logging.INFO):
                path = scope.get("path", "")
                if len(path) > 200:
                    path = path[:200] + "..."
                if not path.isprintable():  # percent-decoded: no newline may forge a log line
                    path = path.encode("unicode_escape").decode("ascii")
                client = scope.get("client")
                access_log.info("%s %s %d %.2fms batch=%s client=%s", scope.get("method"), path, status,
                                (time.perf_counter() - start) * 1e3, scope.get("lattice.batch", "-"),
                                f"{client[0]}:{client[1]}" if client else "-")


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
            # a database deleted and restored, or truncated, under the running server: reopened
            # or reported as unreadable here, within one poll (never read as "no champion")
            self.registry.watch_database()
            v = self.registry.by_alias(CHAMPION)
            return v.version if v else None

        def load(version: int) -> Predictor:
            info = self.registry.version(version)
            # the served version's own FeatureService (named at registration) must be in Feast
            self.online.check_service(info.tags.get("lattice.feature_service"), f"{info.name} v{version}")
            return Predictor.load(self.registry.download(info), version=info)

        self.slot: ModelSlot[Predictor] = ModelSlot(current, load, poll_seconds=poll_seconds)
        self.online = OnlineFeatures(config, paths)
        if config.features.aggregates:
            self.online.open()

    def score(self, reqs: list, ops: ServingOps | None = None, served=None, logged_at: float | None = None) -> dict[str, Any]:
        """Requests -> the response body (`PredictResponse`'s layout) as plain Python values.
        `ops`: where the scored batch is recorded (prediction log, metrics). `served`: the model
        to use (a batch scored in chunks passes the one it read first: one whole model).
        `logged_at`: the log's time for these rows (a replay's; default now)."""
        served = served if served is not None else self.slot.current  # read once: one whole model
        if served is None:
            raise LookupError("no champion model is loaded yet")
        cols = request_columns(served.model.config, reqs, {})
        # the store's counters before and after this lookup (requests are scored one at a time
        # on the event loop): a fallback means the store was unreadable, not the entity unknown
        errors0, reads0 = getattr(self.online, "fallbacks", 0), getattr(self.online, "reads", 0)
        # the ids hashed for the model are the keys of the online lookup: hash once
        aggregates, unknown = self.online.lookup_ids({k: cols.sparse[k][0] for k in self.online.entity_keys})
        cols.dense.update(aggregates)
        probs = served.model.predict_columns(cols)
        if ops is not None:
            ops.record(reqs, cols, probs, unknown, getattr(self.online, "fallbacks", 0) - errors0,
                       getattr(self.online, "reads", 0) - reads0, served.version, logged_at)
        names = list(probs)
        rows = zip(*(probs[o].tolist() for o in names))  # python floats, one conversion per objective
        preds = [
            {"request_id": r.request_id, "domain": r.domain, "probabilities": dict(zip(names, p)), "unknown_entities": u}
            for r, p, u in zip(reqs, rows, unknown)
        ]
        return {"model_version": served.version, "predictions": preds}


def create_app(config: PlatformConfig, paths: Paths, poll_seconds: float = 2.0, server: Server | None = None,
               replay_clock: bool = False) -> FastAPI:
    """`server`: one already built (tests stand one in without a registry); by default the
    lifespan builds it. `replay_clock`: a /predict request may set the time its rows are logged
    at (`X-Lattice-Logged-At`), for replaying a past day's traffic through the server (a
    backtest, the simulated market of bench_market_life); refused otherwise, so that a live
    server's log time is always its own. Raises ServingStartupError when
    `serving.auth_token_env` names a variable that is not set."""
    server_box: dict[str, Server] = {}
    prebuilt = server
    limits = config.serving
    token = _auth_token(limits.auth_token_env)
    max_body = limits.max_body_bytes

    # prediction log + Prometheus metrics; built with the app so that /metrics counts from the start
    ops = ServingOps(config, paths.workdir if paths is not None else None)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server = prebuilt if prebuilt is not None else await run_in_threadpool(Server, config, paths, poll_seconds)
        await run_in_threadpool(server.slot.refresh)
        server.slot.start()
        server_box["s"] = server
        app.state.server = server
        app.state.ops = ops
        try:
            yield
        finally:
            server.slot.stop()
            await run_in_threadpool(ops.close)  # a clean stop writes every acknowledged log record

    client_limits = limits.limits
    limiter = ClientLimiter(client_limits, limits.max_batch)
    scheduler = FairScheduler()

    async def authorized(request: Request) -> None:  # async: a sync dependency goes through a thread
        """401 without the token (checked before the body is read)."""
        if token is not None and (problem := _credentials_problem(request, token)) is not None:
            raise HTTPException(status_code=401, detail=problem, headers={"WWW-Authenticate": "Bearer"})

    async def admitted(request: Request):
        """This client's request slot (429 over serving.limits.max_requests_in_flight), held to
        the end of the request; its rows are admitted once the body is read."""
        ticket = limiter.admit(client_key(request.scope))
        try:
            yield ticket
        finally:
            ticket.release()

    app = FastAPI(title=f"Lattice {config.name} ranking", lifespan=lifespan)
    app.state.limiter = limiter
    # a slow body is cut off whatever route reads it (the access log and metrics, added after,
    # wrap it and so count the 408)
    app.add_middleware(BodyTimeout, seconds=client_limits.body_timeout_seconds)
    if limits.access_log:
        app.add_middleware(AccessLog)
    if ops.metrics is not None:
        app.add_middleware(MetricsMiddleware, metrics=ops.metrics)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        # any route's unexpected failure answers JSON; Starlette then re-raises it to the server's log
        return JSONResponse(status_code=500, content={"detail": "internal server error"})

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> JSONResponse:
        # Connection: close: a request refused before its body was read leaves that body unread
        # on the connection; closing it holds nothing for the refused client (it retries anew)
        return JSONResponse(status_code=429, content={"detail": str(exc)},
                            headers={"Retry-After": str(exc.retry_after), "Connection": "close"})

    @app.post("/predict", response_model=PredictResponse, dependencies=[Depends(authorized)])
    async def predict(request: Request, ticket: Ticket = Depends(admitted)) -> Any:
        server = server_box["s"]
        try:
            raw = await _read_body(request, max_body)
            reqs = await _parse_fairly(raw, server.schema, ticket.client)
        except RequestError as exc:
            return JSONResponse(status_code=exc.status, content={"detail": str(exc)})
        except BodyTooSlow as exc:
            return body_timeout_response(str(exc))
        except ClientDisconnect:
            return JSONResponse(status_code=400, content={"detail": "client disconnected before sending the whole body"})
        except Exception:  # a bug, not the client's input: logged with its traceback
            log.exception("reading a /predict body failed")
            return JSONResponse(status_code=500, content={"detail": "internal error while reading the request; see the server log"})
        try:
            logged_at = replayed_time(request.headers.get(LOGGED_AT_HEADER), replay_clock)
        except RequestError as exc:
            return JSONResponse(status_code=exc.status, content={"detail": str(exc)})
        request.scope["lattice.batch"] = len(reqs)
        ticket.rows(len(reqs))  # 429 over serving.limits.max_rows_in_flight
        served = server.slot.current  # read once: every chunk of this batch is scored by one model
        if served is None:
            return JSONResponse(status_code=503, content={"detail": "no champion model is loaded yet"})
        try:
            # Scored on the event loop, not in a worker thread: the work is CPU-bound under the
            # GIL either way, and the thread hand-off cost more than a single row's lookup and
            # forward. A batch goes in chunks, each after its fair turn among the clients. The
            # response is serialised once here by msgspec (the route's response_model only
            # documents it), instead of FastAPI validating it again.
            body = await _score_fairly(server, reqs, served, ticket.client, logged_at)
        except LookupError as exc:
            return JSONResponse(status_code=503, content={"detail": str(exc)})
        except Exception:  # the last resort: valid input never gets here; logged with its traceback
            log.exception("scoring %d request(s) failed", len(reqs))
            return JSONResponse(status_code=500, content={"detail": "internal error while scoring; see the server log"})
        return Response(content=msgspec.json.encode(body), media_type="application/json")

    async def _parse_fairly(raw: bytes, schema: RequestSchema, client: str) -> list:
        """A small body (a lone request, a few rows) is parsed at once: it costs microseconds,
        less than waiting for a turn, so a single request waits for one turn (its scoring), not
        two. A big batch's parse is this client's time too, in turns no longer than a scoring
        chunk's: the decode, then the request rules a chunk of rows at a time."""
        if len(raw) <= _TURNLESS_BODY_BYTES:
            return parse_body(raw, schema)[0]
        async with scheduler.turn(client):
            reqs, batch, checked = decode_body(raw, schema)
        chunk = client_limits.score_chunk_rows
        for i in range(0, 0 if checked else len(reqs), chunk):
            async with scheduler.turn(client):
                schema.check_all(reqs[i:i + chunk], batch, start=i)
        return reqs

    async def _score_fairly(server: Server, reqs: list, served, client: str, logged_at: float | None = None) -> dict[str, Any]:
        chunk = client_limits.score_chunk_rows
        body: dict[str, Any] | None = None
        for i in range(0, len(reqs), chunk):
            async with scheduler.turn(client):
                out = server.score(reqs[i:i + chunk], ops, served=served, logged_at=logged_at)
            if body is None:
                body = out
            else:
                body["predictions"].extend(out["predictions"])
        return body

    @app.get("/healthz")
    async def healthz(strict: bool = False) -> Any:
        server = server_box["s"]
        served = server.slot.current
        # the online store's state (it may ask Redis, bounded by its socket timeouts): off the loop
        check = getattr(server.online, "health", None)
        store = await run_in_threadpool(check) if check is not None else None
        degraded = store is not None and store["status"] != "ok"
        registry = server.slot.state()  # served vs named, and why they differ
        if not served:
            status = "no_model"
        elif registry["status"] != "ok":
            status = registry["status"]  # still answering with the served version; not "ok"
        else:
            status = "degraded" if degraded else "ok"
        body = {
            # degraded: still answering (200), with the fallback the online store section names
            "status": status,
            "model_version": served.version if served else None,
            "registry": registry,
            "swaps": server.slot.swaps,
            "last_error": server.slot.last_error,
            "online_features": server.online.mode,
            "online_store": store,
            "pid": os.getpid(),  # which uvicorn worker answered (each holds its own slot and store)
        }
        if degraded:
            body["degraded"] = [f"online store {store['store']}: {store['status']} ({store.get('error')})"]
        body["prediction_log"], warnings = ops.health()
        if warnings:
            body["warnings"] = warnings
        # 200 while a model answers (a fleet whose registry is briefly unreadable keeps serving);
        # `?strict=true` (a deploy check): 503 unless the served version is the registry's
        code = 503 if not served or (strict and status not in ("ok", "degraded")) else 200
        return JSONResponse(status_code=code, content=body)

    @app.get("/metrics")
    async def metrics() -> Response:
        if ops.metrics is None:
            return JSONResponse(status_code=404, content={"detail": "metrics are off (monitoring.metrics: false)"})
        served = server_box["s"].slot.current
        ops.model_version(served.version if served else None)
        ops.health()  # drops counted since the last write reach the counter too
        data, content_type = ops.metrics.exposition()
        return Response(content=data, media_type=content_type)

    @app.get("/metadata", dependencies=[Depends(authorized)])
    async def metadata(request: Request) -> Any:
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
            "checksum": served.model.checksum,  # of the bytes loaded (verified against the registered one)
            "objectives": config.objective_names,
            "domains": config.domain_names,
            "loaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(served.loaded_at)),
            # GEMM sites that run in FP8 in this artifact (site -> recipe); empty: all FP32
            "fp8_sites": served.model.metadata.get("fp8_sites", {}),
            "embeddings": served.model.metadata.get("embeddings", {}),
            # the calibration stage inside the artifact (per cell: the map fitted on validation)
            "calibration": served.model.metadata.get("calibration"),
            # parent (warm start), days seen, judged-on day (lattice.training.lineage)
            "lineage": served.model.metadata.get("lineage"),
            # served vs the registry's champion, and why they differ (as /healthz)
            "registry": server.slot.state(),
        }

    return app
