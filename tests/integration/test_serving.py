"""Serving over real HTTP: a uvicorn server on 127.0.0.1 (random free port) in front of the
champion artifact from the MLflow registry and the Feast online store (SQLite)."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import numpy as np
import pandas as pd
import pytest

from lattice.data import schema as S
from lattice.registry import ModelRegistry
from lattice.serving.client import requests_from_rows
from lattice.registry.stages import register
from test_distill import copy_workdir, trained_workdir

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThreadedServer:
    def __init__(self, app):
        import uvicorn

        self.port = _free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "ThreadedServer":
        self.thread.start()
        deadline = time.time() + 120
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from lattice.export.stages import export_model
    from lattice.serving.app import create_app
    from pipelines.feast_jobs import feast_apply, materialize

    config, _ = trained_workdir()
    paths = copy_workdir(tmp_path_factory.mktemp("serving") / "wd")
    feast_apply(config, paths)
    materialize(config, paths)
    reg = ModelRegistry(config, paths)
    champion = reg.version(register(config, paths, "student")["version"])
    reg.promote(champion)  # the gate has its own tests; here any champion will do
    export_model(config, paths, "student@noteacher")
    other = reg.version(register(config, paths, "student@noteacher")["version"])
    with ThreadedServer(create_app(config, paths, poll_seconds=0.2)) as server:
        yield {"config": config, "paths": paths, "reg": reg, "url": server.url, "versions": {"student": champion.version,
               "student@noteacher": other.version}}


_requests = requests_from_rows


def _offline(config, paths, model: str, rows: pd.DataFrame) -> dict[str, np.ndarray]:
    """The trained model (training code path, eager) on the same rows, with the entity features
    the online store holds for them (what serving must use)."""
    from features.store import online_features
    from lattice.data.loader import batch_from_frame
    from lattice.evaluation.stages import load_model, predict

    frame = rows.copy()
    entity = [f.column for f in config.entity_features]
    online = online_features(config, paths, [{k: int(v) for k, v in zip(entity, vals)} for vals in frame[entity].to_numpy()])
    for c in S.aggregate_columns(config):
        frame[c] = [0.0 if v is None else float(v) for v in online[c]]
    net = load_model(config, paths, model)
    probs = predict(net, batch_from_frame(config, net.dense_stats, frame))
    return {o: p.numpy() for o, p in probs.items()}


@pytest.fixture(scope="module")
def window(served):
    from lattice.export.window import load_window

    return load_window(served["config"], served["paths"], "test", max_rows=256, seed=1)


def test_healthz_and_metadata(served):
    h = httpx.get(served["url"] + "/healthz").json()
    assert h["status"] == "ok" and h["model_version"] == served["versions"]["student"]
    m = httpx.get(served["url"] + "/metadata").json()
    assert m["model_version"] == served["versions"]["student"] and m["alias"] == "champion"
    assert m["feature_service"] == "demo_v1" and m["training_date"] and m["checksum"]
    assert m["objectives"] == served["config"].objective_names


def test_predictions_equal_offline(served, window):
    config = served["config"]
    reqs = _requests(config, window)
    resp = httpx.post(served["url"] + "/predict", json={"requests": reqs}, timeout=60)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["model_version"] == served["versions"]["student"]
    preds = body["predictions"]
    assert [p["request_id"] for p in preds] == list(window["example_id"])
    want = _offline(config, served["paths"], "student", window)
    for o in config.objective_names:
        got = np.array([p["probabilities"][o] for p in preds])
        np.testing.assert_allclose(got, want[o], atol=1e-5, rtol=0)
    assert all(p["unknown_entities"] == [] for p in preds)  # every test-row entity has history
    # the single-request form gives the same numbers
    for i in range(5):
        one = httpx.post(served["url"] + "/predict", json=reqs[i], timeout=30).json()["predictions"][0]
        for o in config.objective_names:
            assert one["probabilities"][o] == pytest.approx(float(want[o][i]), abs=1e-5)


def test_unknown_entity_gets_defaults_and_flag(served, window):
    config = served["config"]
    rows = window.head(3).copy()
    rows["user_id"] = [987_654_321_001, 987_654_321_002, 987_654_321_003]  # never logged
    resp = httpx.post(served["url"] + "/predict", json={"requests": _requests(config, rows)}, timeout=30)
    assert resp.status_code == 200, resp.text
    preds = resp.json()["predictions"]
    assert [p["unknown_entities"] for p in preds] == [["user_id"]] * 3
    want = _offline(config, served["paths"], "student", rows)  # the store has nothing: aggregates 0
    for o in config.objective_names:
        np.testing.assert_allclose([p["probabilities"][o] for p in preds], want[o], atol=1e-5, rtol=0)
    # the online features matter: the same rows with their real users score differently
    known = httpx.post(served["url"] + "/predict", json={"requests": _requests(config, window.head(3))}, timeout=30).json()
    diff = max(abs(a["probabilities"][o] - b["probabilities"][o])
               for a, b in zip(known["predictions"], preds) for o in config.objective_names)
    assert diff > 1e-4


def test_batch_sqlite_reader_matches_feast_online_read(served, window):
    """The server's direct SQLite reader returns what Feast's own online_read returns."""
    from features.store import get_store
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.protos.feast.types.Value_pb2 import Value
    from lattice.serving.sqlite_online import SqliteOnlineReader

    store = get_store(served["config"], served["paths"])
    views = [store.get_feature_view(a.name) for a in served["config"].features.aggregates]
    reader = SqliteOnlineReader(store.config, views)
    provider = store._get_provider()
    try:
        for view in views:
            key, feats = view.join_keys[0], [f.name for f in view.features]
            ids = sorted({int(i) for i in window[key]}) + [987_654_321_009, -5]  # the last two were never logged
            assert reader._template(key) is not None  # the fast key encoding reproduces Feast's
            got = reader.read(view.name, key, feats, ids)
            want = provider.online_read(config=store.config, table=view, requested_features=feats,
                                        entity_keys=[EntityKey(join_keys=[key], entity_values=[Value(int64_val=i)]) for i in ids])
            for i, (_, values) in zip(ids, want):
                expect = [np.nan] * len(feats) if not values else [getattr(values[f], values[f].WhichOneof("val")) for f in feats]
                # stored values read back, no arithmetic on either side: exactly equal
                np.testing.assert_array_equal(got[i], np.array(expect, np.float64))
            assert np.isnan(got[987_654_321_009]).all() and not np.isnan(got[ids[0]]).all()
    finally:
        reader.close()


def test_online_mirror_matches_the_store_and_reloads_after_a_write(served, window):
    """The in-memory copy of the SQLite store answers exactly what the store holds, and a write
    to the store (as a materialization makes) reaches it without a restart."""
    import datetime as dt

    from features.store import get_store
    from lattice.serving.online import OnlineFeatures

    config, paths = served["config"], served["paths"]
    online = OnlineFeatures(config, paths)
    online.open()
    assert online.mode == "mirror"
    new_user = 987_654_321_777  # never logged
    ids = {k: np.array([int(i) for i in window[k]] + [new_user, -5], np.int64) for k in online.entity_keys}
    ids["ad_id"][-2:] = ids["ad_id"][0]  # known ads: only the user is new
    got = online._fetch(ids)
    want = {}
    for view, key, feats in online._views:
        rows = online._sqlite.read(view.name, key, feats, ids[key].tolist())
        for j, f in enumerate(feats):
            want[f] = np.array([rows[i][j] for i in ids[key].tolist()])
    assert got.keys() == want.keys()
    for c in want:
        # stored values read back, no arithmetic: exactly equal, NaN where absent on both sides
        np.testing.assert_array_equal(got[c], want[c])
    assert online.reads == 0 and online.lookup_ids(ids)[1][-2] == ["user_id"]

    view = next(a for a in config.features.aggregates if a.entity == "user_id")
    cols = [c for c, k in online.columns.items() if k == "user_id"]
    now = dt.datetime.now(dt.timezone.utc)
    row = {"user_id": [new_user], "event_timestamp": [now], "created": [now]}
    row.update({c: [0.25] if "rate" in c else [3] for c in cols})
    get_store(config, paths).write_to_online_store(view.name, df=pd.DataFrame(row))
    deadline = time.time() + 30
    while True:
        aggs, unknown = online.lookup_ids(ids)
        if unknown[-2] == [] or time.time() > deadline:
            break
        time.sleep(0.05)
    assert unknown[-2] == [] and online.reloads >= 1 and online.mode == "mirror"
    assert all(aggs[c][-2] == (0.25 if "rate" in c else 3.0) for c in cols)
    assert unknown[-1] == ["user_id"]  # still never seen
    assert online.reads == 0


def test_a_store_too_large_to_hold_is_read_on_demand_and_tried_again_when_it_changes(served, window):
    import datetime as dt

    from features.store import get_store
    from lattice.serving.online import OnlineFeatures

    config, paths = served["config"], served["paths"]
    small = config.model_copy(update={"serving": config.serving.model_copy(update={"online_mirror_entities": 1})})
    online = OnlineFeatures(small, paths)
    online.open()
    ids = {k: np.array([int(i) for i in window[k]], np.int64) for k in online.entity_keys}
    before, _ = online.lookup_ids(ids)
    assert online.mode == "cache" and online.reads > 0  # too large for 1 entity: read on demand
    online._mirror_entities = 1_000_000  # as if the limit were raised (or the store had shrunk)
    view = next(a for a in config.features.aggregates if a.entity == "user_id")
    now = dt.datetime.now(dt.timezone.utc)
    row = {"user_id": [987_654_321_778], "event_timestamp": [now], "created": [now]}
    row.update({c: [1] if "count" in c else [0.5] for c, k in online.columns.items() if k == "user_id"})
    get_store(config, paths).write_to_online_store(view.name, df=pd.DataFrame(row))
    deadline = time.time() + 30
    while online.mode != "mirror" and time.time() < deadline:
        online.lookup_ids(ids)
        time.sleep(0.05)
    assert online.mode == "mirror"
    after, _ = online.lookup_ids(ids)
    assert all(np.array_equal(before[c], after[c]) for c in before)  # same values, now from memory


GOOD = {"domain": "feed", "entities": {"user_id": 1, "ad_id": 2}, "features": {"device": 1, "price": 1.5}}


@pytest.mark.parametrize("body, fragment", [
    ({**GOOD, "domain": "radio"}, "unknown domain 'radio'"),
    ({**GOOD, "entities": {"user_id": 1}}, "missing entity key(s) ['ad_id']"),
    ({**GOOD, "entities": {"user_id": 1.5, "ad_id": 2}}, "entities.user_id"),
    ({**GOOD, "entities": {"user_id": 1, "ad_id": 2, "shop_id": 3}}, "unknown entity key(s) ['shop_id']"),
    ({**GOOD, "features": {"price": "cheap"}}, "feature 'price' is numeric"),
    ({**GOOD, "features": {"device": 1.5}}, "feature 'device' is categorical"),
    ({**GOOD, "features": {"colour": 1}}, "unknown feature 'colour'"),
    ({**GOOD, "features": {"user_id": 1}}, "is an entity key"),
    ({**GOOD, "domian": "feed"}, "domian: unknown field"),
    ({"entities": {"user_id": 1, "ad_id": 2}}, "domain: required field is missing"),
    ({"requests": []}, "requests"),
    ({"requests": [GOOD, {**GOOD, "domain": "radio"}]}, "requests[1]: unknown domain"),
    ([GOOD], "body must be a JSON object"),
])
def test_bad_requests_get_422_with_a_reason(served, body, fragment):
    resp = httpx.post(served["url"] + "/predict", json=body, timeout=30)
    assert resp.status_code == 422, resp.text
    assert fragment in resp.json()["detail"]


def test_malformed_json_and_wrong_method(served):
    resp = httpx.post(served["url"] + "/predict", content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 422 and "not valid JSON" in resp.json()["detail"]
    assert httpx.get(served["url"] + "/predict").status_code == 405


def test_hot_swap_during_a_request_stream_drops_nothing(served, window):
    config, reg, url = served["config"], served["reg"], served["url"]
    rows = window.head(16)
    reqs = {"requests": _requests(config, rows)}
    expected = {served["versions"][m]: _offline(config, served["paths"], m, rows) for m in ("student", "student@noteacher")}
    results: list[tuple[int, dict | str]] = []
    stop = threading.Event()

    def stream() -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                r = client.post(url + "/predict", json=reqs)
                results.append((r.status_code, r.json() if r.status_code == 200 else r.text))

    t = threading.Thread(target=stream)
    t.start()
    try:
        time.sleep(1.0)
        new = served["versions"]["student@noteacher"]
        reg.promote(reg.version(new))  # the alias moves while requests are in flight
        deadline = time.time() + 90
        while time.time() < deadline and not any(code == 200 and b["model_version"] == new for code, b in results):
            time.sleep(0.1)
        time.sleep(1.0)
    finally:
        stop.set()
        t.join(timeout=60)
    assert results and all(code == 200 for code, _ in results), [b for c, b in results if c != 200][:3]
    versions = [b["model_version"] for _, b in results]
    old = served["versions"]["student"]
    assert versions[0] == old and versions[-1] == new
    assert versions == sorted(versions, key=lambda v: v != old)  # old ... old, new ... new: one clean switch
    for _, b in results:  # every response is wholly one model's answer
        want = expected[b["model_version"]]
        for o in config.objective_names:
            np.testing.assert_allclose([p["probabilities"][o] for p in b["predictions"]], want[o], atol=1e-5, rtol=0)
    assert httpx.get(url + "/healthz").json()["swaps"] >= 2


def test_batch_predict_equals_serving_and_keeps_every_row(served, tmp_path):
    """`lattice predict` on a raw feed log (the source's own schema) gives the scores serving
    gives the same rows; a bad row is quarantined with its reason; pass-through columns join back."""
    import csv

    from lattice.scoring.batch import predict_file

    base, paths = served["config"], served["paths"]
    sources = [s.model_copy(update={"passthrough": ["uid", "aid", "ts"]}) if s.name == "feed_log" else s for s in base.sources]
    config = base.model_copy(update={"sources": sources})
    src = next(s for s in config.sources if s.name == "feed_log")
    raw_file = sorted(paths.source_path(src.path).parent.glob("*.csv"))[0]
    with open(raw_file, newline="") as fh:
        rows = list(csv.DictReader(fh))[:150]
    bad = dict(rows[0], ts="not-a-time")
    (tmp_path / "in").mkdir()
    with open(tmp_path / "in" / "feed.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows([*rows, bad])
    out = predict_file(config, paths, str(tmp_path / "in"), str(tmp_path / "scores.parquet"), model="champion")
    assert (out["rows_in"], out["rows_scored"], out["quarantined"]) == (151, 150, 1)
    assert out["quarantine_reasons"] == {"bad_timestamp": 1} and out["source"] == "feed_log"
    scores = pd.read_parquet(tmp_path / "scores.parquet")
    assert {"uid", "aid", "ts", "p_click", "p_conversion"} <= set(scores.columns)

    entity = {raw: canon for raw, canon in src.columns.items() if canon in ("user_id", "ad_id")}
    dense = {f.column for f in config.features.dense}
    reqs = []
    for r in rows:
        feats = {canon: (float(r[raw]) if canon in dense else int(r[raw])) for raw, canon in src.columns.items()
                 if raw not in entity and r[raw] != ""}
        reqs.append({"request_id": f"{r['uid']}|{r['aid']}|{r['ts']}", "domain": "feed",
                     "entities": {canon: int(r[raw]) for raw, canon in entity.items()}, "features": feats})
    resp = httpx.post(served["url"] + "/predict", json={"requests": reqs}, timeout=60)
    assert resp.status_code == 200, resp.text
    served_p = {p["request_id"]: p["probabilities"] for p in resp.json()["predictions"]}
    for r in scores.to_dict("records"):
        want = served_p[f"{r['uid']}|{r['aid']}|{r['ts']}"]
        for o in config.objective_names:
            assert r[f"p_{o}"] == pytest.approx(want[o], abs=1e-5)
