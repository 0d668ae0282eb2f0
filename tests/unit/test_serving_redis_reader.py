"""The Redis reader's pieces without a Redis: Feast's field names, value decoding, connection
strings, the circuit breaker, and a dead endpoint answered fast (the server then falls back; see
online.py). Reads from a real Redis: tests/integration/test_serving_scaleout.py."""

from __future__ import annotations

import socket
import time
from types import SimpleNamespace

import numpy as np
import pytest

from lattice.serving.redis_online import (CircuitBreaker, OnlineStoreUnavailable, RedisOnlineReader, _numbers,
                                          parse_connection_string)


def test_field_names_are_the_ones_feast_writes():
    from feast.infra.online_stores.helpers import _mmh3  # Feast's own (private) hash, checked here only

    from lattice.serving.feast_keys import field_key

    for view, feature in [("user_click_stats", "user_click_stats_count_1d"), ("v", "f"), ("ad_conv", "rate_7d")]:
        assert field_key(view, feature) == _mmh3(f"{view}:{feature}")


def test_numbers_decode_counts_rates_and_absent():
    from feast.protos.feast.types.Value_pb2 import Value

    blobs = [Value(int64_val=7).SerializeToString(), Value(double_val=0.25).SerializeToString(), None,
             Value(int64_val=-3).SerializeToString(), Value(int64_val=7).SerializeToString()]
    got = _numbers(blobs)
    assert got[[0, 1, 3, 4]].tolist() == [7.0, 0.25, -3.0, 7.0] and np.isnan(got[2])


def test_connection_string_keeps_a_numeric_password_a_string():
    ep = parse_connection_string("127.0.0.1:6390,password=12e45,db=2")
    assert ep == {"host": "127.0.0.1", "port": 6390, "password": "12e45", "username": None, "db": 2, "ssl": False}
    assert parse_connection_string("h:1,ssl=true")["ssl"] is True  # TLS: redis-py speaks it
    with pytest.raises(ValueError, match="clusters"):
        parse_connection_string("h:1,redis_type=redis_cluster")


def test_breaker_opens_backs_off_and_closes():
    b = CircuitBreaker(cooldown=0.05, max_cooldown=0.2)
    assert b.allow() and not b.open
    b.failure(ConnectionRefusedError("refused"))
    assert b.open and not b.allow() and "refused" in b.error
    time.sleep(0.06)
    assert b.allow()  # one trial after the cool-down
    b.failure(TimeoutError("slow"))
    assert b.cooldown == pytest.approx(0.1)
    b.success()
    assert not b.open and b.allow() and b.cooldown == 0.05


def test_dead_redis_is_refused_fast_then_skipped():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    cfg = SimpleNamespace(online_store=SimpleNamespace(connection_string=f"127.0.0.1:{port},password=x", redis_type="redis"),
                          project="p", entity_key_serialization_version=3,
                          registry=SimpleNamespace(enable_online_feature_view_versioning=False))
    view = SimpleNamespace(name="v", features=[SimpleNamespace(name="f")], entity_columns=[], projection=None)
    reader = RedisOnlineReader(cfg, [view], breaker=CircuitBreaker(cooldown=10))
    t = time.perf_counter()
    with pytest.raises(OnlineStoreUnavailable):
        reader.read_many([("v", "user_id", ["f"], [1, 2])])
    for _ in range(100):  # the breaker is open: no connection attempt at all
        with pytest.raises(OnlineStoreUnavailable, match="unavailable"):
            reader.read_many([("v", "user_id", ["f"], [1])])
    assert time.perf_counter() - t < 1.0
    assert reader.breaker.failures == 1
