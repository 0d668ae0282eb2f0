"""Serving pieces without a server: request validation against the config, requests -> Arrow rows,
and the hot-swap slot (a failed load keeps the old model; a request sees one whole model)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from lattice.config import load_config
from lattice.serving.app import parse_body
from lattice.serving.frame import request_table
from lattice.serving.requests import PredictRequest, RequestError, RequestSchema
from lattice.serving.slot import ModelSlot

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config():
    return load_config(ROOT / "configs" / "demo.yaml")


def test_valid_single_and_batch(config):
    schema = RequestSchema(config)
    one = b'{"domain": "search", "entities": {"user_id": 5, "ad_id": "a9"}, "features": {"query_category": 3, "price": 2}}'
    reqs, batch = parse_body(one, schema)
    assert not batch and reqs[0].domain == "search" and reqs[0].entities["ad_id"] == "a9"
    reqs, batch = parse_body(b'{"requests": [' + one + b"," + one + b"]}", schema)
    assert batch and len(reqs) == 2


@pytest.mark.parametrize("body, fragment", [
    (b'{"domain": "tv", "entities": {"user_id": 1, "ad_id": 2}}', "unknown domain 'tv'; use one of ['feed', 'search', 'video']"),
    (b'{"domain": "feed", "entities": {"ad_id": 2}}', "missing entity key(s) ['user_id']"),
    (b'{"domain": "feed", "entities": {"user_id": true, "ad_id": 2}}', "entities.user_id"),
    (b'{"domain": "feed", "entities": {"user_id": 1, "ad_id": 2}, "features": {"price": "x"}}', "numeric"),
    (b'{"domain": 3, "entities": {"user_id": 1, "ad_id": 2}}', "domain"),
    (b'{"requests": [{"domain": "feed", "entities": {"user_id": 1, "ad_id": 2}}, {"domain": "feed"}]}', "requests.1.entities"),
    (b"[]", "JSON object"),
    (b"nope", "not valid JSON"),
])
def test_invalid_requests_name_the_problem(config, body, fragment):
    with pytest.raises(RequestError) as exc:
        parse_body(body, RequestSchema(config))
    assert fragment in str(exc.value)


@pytest.mark.parametrize("body, status, fragment", [
    (b"\xff{}", 400, "not UTF-8"),
    (b"[" * 5000, 400, "nested too deeply"),
    (b'{"domain": "feed", "entities": {"user_id": "\\ud800", "ad_id": 2}}', 400, "not valid Unicode"),
    (b'{"domain": "feed", "entities": {"user_id": 1, "ad_id": 2}, "features": {"price": NaN}}', 422, "must be a finite number"),
    (b'{"domain": "feed", "entities": {"user_id": 1, "ad_id": 2}, "features": {"activity": -1e999}}', 422,
     "feature 'activity' must be a finite number, got -inf"),
    (b'{"domain": "feed", "entities": {"user_id": 9223372036854775808, "ad_id": 2}}', 422, "entities.user_id"),
    (b'{"requests": [' + b", ".join([b"{}"] * 1025) + b"]}", 413, "over the limit of 1024 (serving.max_batch)"),
])
def test_parse_body_gives_each_problem_its_status(config, body, status, fragment):
    with pytest.raises(RequestError) as exc:
        parse_body(body, RequestSchema(config))
    assert exc.value.status == status and fragment in str(exc.value)


@pytest.mark.parametrize("value", [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b'"\\ud800"', b'"\\udc00"',
                                   b"9223372036854775808", b"-9223372036854775809"])
def test_the_wire_structs_refuse_what_the_fast_path_does_not_check(value):
    """A valid body is never given `value_problem`'s pass: msgspec itself must keep refusing
    non-finite numbers, unpaired surrogates and integers outside int64 (if an upgrade changed
    that, such values would reach the model)."""
    import msgspec

    from lattice.serving.requests import WireRequest

    for body in (b'{"domain": "feed", "entities": {"user_id": %s, "ad_id": 2}}' % value,
                 b'{"domain": "feed", "entities": {"user_id": 1, "ad_id": 2}, "features": {"price": %s}}' % value):
        with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
            msgspec.convert(msgspec.json.decode(body), WireRequest)


def test_check_applies_the_value_rules_to_a_pydantic_request(config):
    schema = RequestSchema(config)
    ok = PredictRequest(domain="feed", entities={"user_id": 2**63 - 1, "ad_id": -(2**63)}, features={"price": 1e300})
    schema.check(ok)
    for req, fragment in [
        (ok.model_copy(update={"entities": {"user_id": 2**63, "ad_id": 1}}), "entities.user_id: 9223372036854775808 does not fit"),
        (ok.model_copy(update={"features": {"position": -(2**63) - 1}}), "features.position"),
        (ok.model_copy(update={"features": {"price": float("nan")}}), "feature 'price' must be a finite number, got nan"),
        (ok.model_copy(update={"features": {"activity": float("inf")}}), "feature 'activity' must be a finite number"),
    ]:
        with pytest.raises(RequestError) as exc:
            schema.check(req, index=3)
        assert str(exc.value).startswith("requests[3]: ") and fragment in str(exc.value)


def test_request_rows_follow_the_consolidation_contract(config):
    from lattice.data import schema as S

    reqs = [PredictRequest(domain="video", entities={"user_id": 7, "ad_id": "ab12"}, features={"activity": 0.5}),
            PredictRequest(domain="feed", entities={"user_id": 8, "ad_id": 9}, features={"price": 3, "device": "ios"})]
    t = request_table(config, reqs, {}).to_pydict()
    assert t["ad_id"] == [S.stable_id("ab12"), 9] and t["device"] == [None, S.stable_id("ios")]
    assert t["price"] == [0.0, 3.0] and t["price_present"] == [0, 1] and t["activity_present"] == [1, 0]
    assert all(t[c] == [0.0, 0.0] for c in S.aggregate_columns(config))  # no store answer: the no-history default


def test_slot_swaps_whole_models_and_survives_a_failed_load():
    target = {"v": 1}
    loads: list[int] = []

    def load(version: int) -> dict:
        loads.append(version)
        if version == 3:
            raise RuntimeError("corrupt artifact")
        time.sleep(0.05)  # a slow load must not be visible to readers
        return {"version": version, "weights": [version] * 1000}

    slot = ModelSlot(lambda: target["v"], load, poll_seconds=0.01)
    assert slot.refresh() and slot.current.version == 1
    assert not slot.refresh()  # unchanged alias: nothing reloaded
    seen: list[tuple[int, int, bool]] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            served = slot.current  # what a request does: read the reference once
            seen.append((served.version, served.model["version"], set(served.model["weights"]) == {served.version}))

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    slot.start()
    target["v"] = 2
    deadline = time.time() + 10
    while slot.current.version != 2 and time.time() < deadline:
        time.sleep(0.01)
    target["v"] = 3  # fails to load: version 2 keeps serving and the error is reported
    while 3 not in loads and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    stop.set()
    slot.stop()
    for t in threads:
        t.join()
    assert slot.current.version == 2 and "corrupt artifact" in slot.last_error
    assert all(v == m and whole for v, m, whole in seen) and {v for v, _, _ in seen} == {1, 2}


class _FakeProvider:
    """Stands in for Feast's provider: answers online_read from a dict and counts reads."""

    def __init__(self, rows: dict[int, dict[str, float]]):
        self.rows, self.reads = rows, []

    def online_read(self, config, table, entity_keys, requested_features):
        from feast.protos.feast.types.Value_pb2 import Value

        out = []
        for k in entity_keys:
            i = k.entity_values[0].int64_val
            self.reads.append((table, i))
            vals = self.rows.get(i)
            out.append((None, None if vals is None else {f: Value(double_val=vals[f]) for f in requested_features}))
        return out


def _online(config, cache_seconds: float, rows: dict[int, dict[str, float]]):
    from types import SimpleNamespace

    from lattice.paths import Paths
    from lattice.serving.online import OnlineFeatures

    cfg = config.model_copy(update={"serving": config.serving.model_copy(update={"feature_cache_seconds": cache_seconds})})
    online = OnlineFeatures(cfg, Paths(workdir=ROOT, data_root=ROOT))
    provider = _FakeProvider(rows)
    online._store, online._provider = SimpleNamespace(config=None), provider
    # one view per entity key, each with every aggregate column of that key
    online._views = [(SimpleNamespace(name=f"{key}_view"), key, [c for c, k in online.columns.items() if k == key])
                     for key in online.entity_keys]
    return online, provider


def test_online_cache_reads_each_entity_once_and_flags_unknown_ones(config):
    from lattice.data import schema as S

    known = {7: {c: 2.0 for c in S.aggregate_columns(config)}}
    online, provider = _online(config, 30.0, known)
    ents = [{"user_id": 7, "ad_id": 7}, {"user_id": 8, "ad_id": 7}]
    aggs, unknown = online.lookup(ents)
    assert aggs["user_click_count_7d"].tolist() == [2.0, 0.0] and aggs["ad_click_rate_1d"].tolist() == [2.0, 2.0]
    assert unknown == [[], ["user_id"]]
    first = len(provider.reads)
    assert first == 3  # user 7, user 8, ad 7: each read once though ad 7 appears twice
    again, unknown_again = online.lookup(ents)
    assert len(provider.reads) == first and unknown_again == unknown  # all from the cache
    assert all((again[c] == aggs[c]).all() for c in aggs)

    uncached, provider = _online(config, 0, known)
    uncached.lookup(ents)
    uncached.lookup(ents)
    assert len(provider.reads) == 6  # cache off: the store answers every request


@pytest.mark.parametrize("field, value", [("int64_val", 0), ("int64_val", 300), ("int64_val", -7), ("int64_val", 2**62 + 3),
                                          ("double_val", 0.25), ("double_val", -0.0), ("float_val", 1.5), ("int32_val", 9),
                                          ("bool_val", True), (None, None)])
def test_online_value_decoding_matches_protobuf(field, value):
    """The SQLite reader's direct decoding of int64 and double values equals a protobuf parse."""
    import math

    from feast.protos.feast.types.Value_pb2 import Value

    from lattice.serving.sqlite_online import _number

    got = _number((Value(**{field: value}) if field else Value()).SerializeToString())
    assert math.isnan(got) if field is None else got == float(value)


def test_an_id_outside_an_exact_id_table_is_refused_not_wrapped(config):
    """user_segment has `hashing: none` and 64 rows in the demo config: id 64 or -1 would land on
    another id's row if wrapped; the feature stage quarantines such rows, serving answers 422."""
    schema = RequestSchema(config)
    for bad in (64, -1):
        body = ('{"domain": "feed", "entities": {"user_id": 1, "ad_id": 2}, "features": {"user_segment": %d}}' % bad).encode()
        with pytest.raises(RequestError, match=r"user_segment.*ids 0\.\.63"):
            parse_body(body, schema)
    ok = b'{"domain": "feed", "entities": {"user_id": 1, "ad_id": 2}, "features": {"user_segment": 63}}'
    assert len(parse_body(ok, schema)[0]) == 1
