"""Serving's answers to bad input, limits, authentication and the access log, through the real
FastAPI app (`create_app`) with a stand-in server: the real request parsing, validation and
request -> column code, a fake model and online store (no registry, no trained model).

Every bad body gets its 4xx with a message, never a 500, and never a score."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from fastapi.testclient import TestClient

from lattice.config import load_config
from lattice.paths import Paths
from lattice.serving.app import Server, ServingStartupError, create_app
from lattice.serving.requests import RequestSchema
from lattice.serving.slot import ModelSlot

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-token-for-tests"
LIMIT = 16_384  # the body limit of the `client` fixture
GOOD = {"request_id": "r1", "domain": "feed", "entities": {"user_id": 1, "ad_id": 2}, "features": {"device": 1, "price": 1.5}}


@pytest.fixture(scope="module")
def base_config():
    return load_config(ROOT / "configs" / "demo.yaml")


class _Model:
    """Scores 0.25 for every objective; refuses (AssertionError) a column that is not finite, so
    a 200 proves no NaN or infinity reached the model."""

    def __init__(self, config, fail: bool = False):
        self.config, self.fail = config, fail
        self.info = SimpleNamespace(name="stub_ranker", model="student", tags={"lattice.checksum": "abc"})
        self.metadata = {"trained_at": "2024-01-01T00:00:00Z"}
        self.checksum = "abc"

    def predict_columns(self, cols):
        if self.fail:
            raise RuntimeError("the model blew up")
        for name, values in cols.dense.items():
            assert np.isfinite(values).all(), name
        return {o: np.full(len(cols), 0.25) for o in self.config.objective_names}


class _Online:
    mode = "stub"

    def __init__(self, config):
        self.entity_keys = [f.column for f in config.entity_features]

    def lookup_ids(self, ids):
        return {}, [[] for _ in range(len(next(iter(ids.values()))))]


def _server(config, fail: bool = False) -> Server:
    server = Server.__new__(Server)  # the real `score`, without a registry or a store
    server.config, server.paths, server.schema = config, None, RequestSchema(config)
    model = _Model(config, fail)
    server.slot = ModelSlot(lambda: 1, lambda version: model, poll_seconds=3600)
    server.online = _Online(config)
    return server


def _app(config, fail: bool = False, **serving):
    cfg = config.model_copy(update={"serving": config.serving.model_copy(update=serving)})
    # a workdir of its own: the app writes its prediction log there
    return create_app(cfg, Paths(workdir=Path(tempfile.mkdtemp(prefix="lattice-serving-")), data_root=ROOT), server=_server(cfg, fail))


@pytest.fixture(scope="module")
def client(base_config):
    with TestClient(_app(base_config, max_batch=8, max_body_bytes=LIMIT)) as c:
        yield c


def _post(client, body: bytes, **headers):
    return client.post("/predict", content=body, headers={"content-type": "application/json", **headers})


def _with(**changes) -> bytes:
    body = json.loads(json.dumps(GOOD))
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = body
        for p in parents:
            node = node[p]
        node[leaf] = value
    return json.dumps(body).encode()


def _raw(entity: str = "1", price: str = "1.5", device: str = "1") -> bytes:
    return (b'{"domain": "feed", "entities": {"user_id": %s, "ad_id": 2}, "features": {"price": %s, "device": %s}}'
            % (entity.encode(), price.encode(), device.encode()))


def test_valid_requests_score(client):
    resp = _post(client, json.dumps(GOOD).encode())
    assert resp.status_code == 200, resp.text
    assert resp.json()["predictions"][0]["probabilities"] == {"click": 0.25, "conversion": 0.25}
    batch = _post(client, json.dumps({"requests": [GOOD] * 8}).encode())  # exactly max_batch
    assert batch.status_code == 200 and len(batch.json()["predictions"]) == 8
    for edge in (str(2**63 - 1), str(-(2**63))):  # the int64 bounds are ids like any other
        assert _post(client, _raw(entity=edge, device=edge)).status_code == 200


@pytest.mark.parametrize("body, status, fragment", [
    # not readable at all: 400
    (b"\xff\xfe\x00garbage", 400, "not UTF-8"),
    (b'{"domain": "f\xe9ed", "entities": {"user_id": 1, "ad_id": 2}}', 400, "not UTF-8"),
    (b"[" * 5000, 400, "nested too deeply"),
    (b'{"requests": ' + b"[" * 3000 + b"]" * 3000 + b"}", 400, "nested too deeply"),
    (_raw(price="[" * 3000 + "]" * 3000), 400, "nested too deeply"),
    (_raw(price="1" * 5000), 400, "number too long"),
    (_raw(entity='"\\ud800"'), 400, "not valid Unicode"),  # msgspec refuses an unpaired surrogate; json reads it
    (_with(features__device="\udfff"), 400, "not valid Unicode"),
    (b'{"requests": [{"domain": "feed", "entities": {"\\udc00": 1}}]}', 400, "not valid Unicode"),
    # readable, wrong content: 422
    (b"{not json", 422, "not valid JSON"),
    (b"", 422, "not valid JSON"),
    (b"null", 422, "JSON object"),
    (_raw(price="NaN"), 422, "feature 'price' must be a finite number, got nan"),
    (_raw(price="Infinity"), 422, "feature 'price' must be a finite number, got inf"),
    (_raw(price="-Infinity"), 422, "feature 'price' must be a finite number, got -inf"),
    (_raw(price="1e999"), 422, "feature 'price' must be a finite number, got inf"),
    (_raw(entity=str(2**63)), 422, "entities.user_id: 9223372036854775808 does not fit a signed 64-bit integer"),
    (_raw(entity=str(-(2**63) - 1)), 422, "entities.user_id: -9223372036854775809 does not fit"),
    (_raw(entity=str(10**40)), 422, "entities.user_id"),
    (_raw(device=str(2**64)), 422, "features.device: 18446744073709551616 does not fit"),
    (_raw(price=str(10**400)), 422, "features.price"),
    (_raw(entity="NaN"), 422, "entities.user_id"),
    (_raw(device="NaN"), 422, "feature 'device' is categorical"),
    (_with(domain=3), 422, "domain"),
    (_with(domain="radio"), 422, "unknown domain 'radio'"),
    (_with(domain="x" * 10_000), 422, "(10002 characters)"),  # an echoed value is cut short
    (_with(entities=[1, 2]), 422, "entities"),
    (_with(entities__user_id=True), 422, "entities.user_id"),
    (_with(entities__user_id=1.5), 422, "entities.user_id"),
    (_with(features__price="cheap"), 422, "feature 'price' is numeric"),
    (_with(features__price=[1]), 422, "features.price"),
    (_with(request_id=5), 422, "request_id"),
    (_with(colour=1), 422, "colour: unknown field"),
    (b'{"requests": []}', 422, "requests"),
    (b'{"requests": {}}', 422, "requests"),
    (b'{"requests": [' + _raw() + b", " + _raw(price="NaN") + b"]}", 422, "requests[1]: feature 'price' must be a finite number"),
    (b'{"requests": [' + _raw() + b", " + _raw(entity=str(2**63)) + b"]}", 422, "requests[1]: entities.user_id"),
    (b'{"requests": [' + b", ".join([b"{}"] * 8) + b"]}", 422, "more problem(s)"),  # not one line per request
    # over a limit: 413
    (json.dumps({"requests": [GOOD] * 9}).encode(), 413, "batch of 9 requests is over the limit of 8 (serving.max_batch)"),
    (b'{"requests": [' + b", ".join([_raw(price="NaN")] * 9) + b"]}", 413, "serving.max_batch"),  # counted before validated
    (b" " * LIMIT + json.dumps(GOOD).encode(), 413, f"over the limit of {LIMIT} bytes (serving.max_body_bytes)"),
])
def test_each_bad_request_gets_its_4xx(client, body, status, fragment):
    resp = _post(client, body)
    assert resp.status_code == status, resp.text
    assert fragment in resp.json()["detail"]


def test_body_limit_is_exact_and_holds_without_a_content_length(client):
    good = json.dumps(GOOD).encode()
    assert _post(client, good + b" " * (LIMIT - len(good))).status_code == 200  # at the limit: read
    assert _post(client, good + b" " * (LIMIT + 1 - len(good))).status_code == 413

    def chunks(n):  # streamed (chunked), so only the stream can tell the size
        yield good
        for _ in range(n):
            yield b" " * 1000

    resp = client.post("/predict", content=chunks(10), headers={"content-type": "application/json"})
    assert resp.status_code == 200, resp.text
    resp = client.post("/predict", content=chunks(100), headers={"content-type": "application/json"})
    assert resp.status_code == 413 and "serving.max_body_bytes" in resp.json()["detail"]


def _call(app, headers: list[tuple[bytes, bytes]], chunks: int) -> tuple[int, int, dict]:
    """One POST /predict straight through ASGI; returns (status, body chunks the app pulled, body)."""
    pulled, sent = 0, []

    async def receive():
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": b" " * 65536, "more_body": pulled < chunks}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/predict", "raw_path": b"/predict", "query_string": b"", "root_path": "",
             "headers": headers, "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}

    async def run():
        async with app.router.lifespan_context(app):
            await app(scope, receive, send)

    asyncio.run(run())
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], pulled, json.loads(body)


def test_an_oversized_body_is_refused_without_being_read(base_config):
    """The issue's 10 MB batch: refused from its Content-Length before one chunk is read, and a
    body without one is read only up to the limit."""
    app = _app(base_config, max_body_bytes=1_048_576, access_log=False)
    status, pulled, body = _call(app, [(b"content-length", str(10 * 2**20).encode())], chunks=160)
    assert (status, pulled) == (413, 0) and "10485760 bytes is over the limit of 1048576" in body["detail"]
    status, pulled, body = _call(app, [(b"transfer-encoding", b"chunked")], chunks=160)
    assert status == 413 and pulled == 1_048_576 // 65536 + 1


def test_a_real_server_answers_413_before_the_upload_is_sent_and_keeps_serving(base_config):
    """Through uvicorn on a socket: the 413 for a declared 10 MB body arrives while the client
    has sent only its headers and a few bytes, and the server then answers the next client."""
    import socket
    import threading
    import time

    import httpx
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(_app(base_config, access_log=False), host="127.0.0.1", port=port,
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.time() + 60
        while not server.started:
            assert time.time() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(b"POST /predict HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 10485760\r\n\r\n" + b'{"requests": [')
            reply = b""
            while b"max_body_bytes" not in reply:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 413") and b"over the limit of 1048576 bytes" in reply, reply[:300]
        assert httpx.post(f"http://127.0.0.1:{port}/predict", json=GOOD, timeout=10).status_code == 200
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_random_and_mutated_bodies_never_get_a_5xx(client):
    """A few hundred garbage, truncated, bit-flipped and value-swapped bodies: each gets 200 or
    a 4xx with a message; never a 500 (the stub model also refuses non-finite input)."""
    rng = random.Random(20240601)
    nasty = [float("nan"), float("inf"), 1e308, -0.0, 2**63, -(2**63) - 1, 2**63 - 1, 10**30, "", "\x00", "\ud800",
             "null", [], {}, [[[[]]]], True, None, "x" * 3000, -1, 0.5, "NaN"]
    seeds = [json.dumps(GOOD).encode(), json.dumps({"requests": [GOOD, GOOD]}).encode(), _raw(), _raw(price="NaN")]
    tokens = [b"NaN", b"Infinity", b"1e999", b"-", b"9" * 30, b"\xff", b"\x00", b"[", b"{", b"}", b'"', b",", b":", b"\\u0000",
              b"\\ud800", b"true", b"null"]
    bodies = [rng.randbytes(rng.randint(0, 300)) for _ in range(60)]
    for _ in range(300):
        body = bytearray(rng.choice(seeds))
        how = rng.randrange(4)
        if how == 0:  # flip a few bytes
            for _ in range(rng.randint(1, 4)):
                body[rng.randrange(len(body))] = rng.randrange(256)
        elif how == 1:  # truncate
            body = body[:rng.randrange(len(body))]
        elif how == 2:  # splice in a token
            at = rng.randrange(len(body))
            body[at:at + rng.randint(0, 3)] = rng.choice(tokens)
        else:  # a nasty value in a random place
            doc = json.loads(json.dumps(GOOD))
            node = rng.choice([doc, doc["entities"], doc["features"]])
            node[rng.choice(list(node) + ["extra"])] = rng.choice(nasty)
            body = bytearray(json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass"))
        bodies.append(bytes(body))
    statuses = []
    for body in bodies:
        resp = _post(client, body)
        assert resp.status_code in (200, 400, 413, 422), (body[:200], resp.status_code, resp.text[:300])
        if resp.status_code != 200:
            assert resp.json()["detail"], body[:200]
        statuses.append(resp.status_code)
    assert {400, 422} <= set(statuses) and 200 in statuses  # the mix really exercised each kind


def test_an_unexpected_failure_is_a_json_500_with_a_traceback_in_the_log(base_config, caplog):
    with TestClient(_app(base_config, fail=True, access_log=False)) as c, caplog.at_level(logging.ERROR, "lattice.serving"):
        resp = _post(c, json.dumps(GOOD).encode())
    assert resp.status_code == 500 and "internal error" in resp.json()["detail"]
    (record,) = [r for r in caplog.records if r.name == "lattice.serving.app"]
    assert record.exc_info and "the model blew up" in str(record.exc_info[1])


@pytest.fixture()
def authed(base_config, monkeypatch):
    monkeypatch.setenv("LATTICE_TEST_TOKEN", TOKEN)
    with TestClient(_app(base_config, auth_token_env="LATTICE_TEST_TOKEN", max_body_bytes=4096)) as c:
        yield c


@pytest.mark.parametrize("headers, fragment", [
    ({}, "missing credentials"),
    ({"authorization": "Bearer wrong"}, "invalid token"),
    ({"authorization": f"Bearer {TOKEN}x"}, "invalid token"),
    ({"authorization": f"Bearer {TOKEN[:-1]}"}, "invalid token"),
    ({"authorization": "Bearer"}, "invalid token"),
    ({"authorization": f"Basic {TOKEN}"}, "unsupported Authorization scheme"),
    ({"authorization": TOKEN}, "unsupported Authorization scheme"),
    ({"x-api-key": "wrong"}, "invalid token"),
    ({"x-api-key": ""}, "invalid token"),
    ({"x-api-key": "t\u00e9st".encode()}, "invalid token"),  # not ASCII
])
def test_auth_refuses_without_the_token(authed, headers, fragment):
    for resp in (_post(authed, json.dumps(GOOD).encode(), **headers), authed.get("/metadata", headers=headers)):
        assert resp.status_code == 401, resp.text
        assert fragment in resp.json()["detail"] and resp.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("headers", [{"authorization": f"Bearer {TOKEN}"}, {"authorization": f"bearer  {TOKEN} "},
                                     {"x-api-key": TOKEN}, {"x-api-key": "wrong", "authorization": f"Bearer {TOKEN}"}])
def test_auth_accepts_the_token_in_either_header(authed, headers):
    assert _post(authed, json.dumps(GOOD).encode(), **headers).status_code == 200
    meta = authed.get("/metadata", headers=headers)
    assert meta.status_code == 200 and meta.json()["model_version"] == 1


def test_auth_leaves_healthz_open_and_comes_before_the_body(authed):
    assert authed.get("/healthz").status_code == 200
    # an unauthenticated client cannot make the server read (or parse) its body
    assert _post(authed, b" " * 10_000).status_code == 401
    assert _post(authed, b"{not json").status_code == 401


@pytest.mark.parametrize("value", [None, "", "   "])
def test_a_missing_token_variable_stops_startup(base_config, monkeypatch, value):
    if value is None:
        monkeypatch.delenv("LATTICE_TEST_TOKEN", raising=False)
    else:
        monkeypatch.setenv("LATTICE_TEST_TOKEN", value)
    with pytest.raises(ServingStartupError, match="LATTICE_TEST_TOKEN is (not set|empty)"):
        _app(base_config, auth_token_env="LATTICE_TEST_TOKEN")


def test_access_log_has_one_line_per_request_and_no_secrets(base_config, monkeypatch, caplog):
    monkeypatch.setenv("LATTICE_TEST_TOKEN", TOKEN)
    secret_body = {"requests": [dict(GOOD, request_id="private-request-id")] * 3}
    with TestClient(_app(base_config, auth_token_env="LATTICE_TEST_TOKEN")) as c:
        with caplog.at_level(logging.INFO, "lattice.serving.access"):
            c.post("/predict", json=secret_body, headers={"authorization": f"Bearer {TOKEN}"})
            c.post("/predict", json=GOOD)
            c.post("/predict", content=b"{bad", headers={"x-api-key": TOKEN})
            c.get("/healthz")
            c.get("/no/such%0Aforged line?token=" + TOKEN)
    lines = [r.getMessage() for r in caplog.records if r.name == "lattice.serving.access"]
    assert len(lines) == 5, lines
    assert lines[0].startswith("POST /predict 200 ") and "batch=3" in lines[0] and "client=testclient:" in lines[0]
    assert lines[1].startswith("POST /predict 401 ") and "batch=-" in lines[1]
    assert lines[2].startswith("POST /predict 422 ")
    assert lines[3].startswith("GET /healthz 200 ")
    assert lines[4].startswith("GET /no/such\\nforged line 404 ")  # escaped: no forged second line
    assert all("ms batch=" in line for line in lines)
    assert not any(TOKEN in line or "private-request-id" in line or "\n" in line for line in lines)

    with TestClient(_app(base_config, access_log=False)) as c, caplog.at_level(logging.INFO, "lattice.serving.access"):
        caplog.clear()
        c.post("/predict", json=GOOD)
    assert not [r for r in caplog.records if r.name == "lattice.serving.access"]


@pytest.mark.parametrize("body", [b"[" * 5000, b'{"requests": ' + b"[" * 3000 + b"]" * 3000 + b"}",
                                  _raw(price="[" * 3000 + "]" * 3000), b'{"domain": "' + b"[" * 5000 + b'"' + b"}" * 70])
def test_depth_is_judged_by_the_server_not_the_recursion_limit(client, body):
    """A library may raise the interpreter's recursion limit (Airflow's task SDK does); a deep
    body is still a 400 then, and brackets inside a string are text, not depth."""
    import sys

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)
    try:
        resp = _post(client, body)
    finally:
        sys.setrecursionlimit(old)
    if body.startswith(b'{"domain": "['):  # 70 closing braces: deep text, shallow JSON, malformed
        assert resp.status_code == 422, resp.text
    else:
        assert resp.status_code == 400 and "nested too deeply" in resp.json()["detail"], resp.text
