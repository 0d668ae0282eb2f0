"""Batch reads of Feast's Redis online store with redis-py (replies parsed by hiredis), for the
server's hot path, behind a circuit breaker.

Feast keeps one Redis hash per entity: key = serialized entity key + project, one field per
feature (`feast_keys.field_key`: murmur3 of "<view>:<feature>", a serialized Value proto) and a
`_ts:<view>` timestamp (feast/infra/online_stores/redis.py, Feast 0.67). A batch is one pipeline
of HMGETs (every view's entities: one round trip). `tests/integration/test_serving_scaleout.py`
checks it returns what Feast's own `online_read` returns after a materialization, and
bench/bench_redis_client.py measures it against the hand-written socket client it replaced.

A dead or hung Redis must not make each request wait: sockets have short timeouts, and after a
failure the breaker refuses reads for a cool-down (doubling up to `max_cooldown`) without
touching the network; then one read is let through, and its success closes the breaker. The
caller (online.py) answers refused reads with what it has (cache, or no-history defaults).
"""

from __future__ import annotations

import time

import numpy as np

from lattice.serving.feast_keys import encode_keys, field_key, key_template
from lattice.serving.sqlite_online import _number


class OnlineStoreUnavailable(RuntimeError):
    """The online store cannot be read now (down, timing out, or the breaker is open)."""


class CircuitBreaker:
    def __init__(self, cooldown: float = 0.5, max_cooldown: float = 5.0):
        self.base, self.max = cooldown, max_cooldown
        self.cooldown = cooldown
        self.error: str | None = None  # the last failure while open; None: closed
        self.since: float | None = None  # wall time the store became unavailable
        self.failures = 0
        self._retry_at = 0.0

    @property
    def open(self) -> bool:
        return self.error is not None

    def allow(self) -> bool:
        return self.error is None or time.monotonic() >= self._retry_at

    def success(self) -> None:
        self.error, self.since, self.cooldown = None, None, self.base

    def failure(self, exc: BaseException) -> None:
        if self.error is not None:  # a failed trial: wait longer before the next one
            self.cooldown = min(self.cooldown * 2, self.max)
        else:
            self.since = time.time()
        self.error = f"{type(exc).__name__}: {exc}"
        self.failures += 1
        self._retry_at = time.monotonic() + self.cooldown


def parse_connection_string(text: str) -> dict:
    """Feast's `host:port,password=...,db=N[,ssl=true]` -> redis-py's host, port, password,
    username, db, ssl (strings kept as written: a password of digits stays a string)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    host, _, port = parts[0].partition(":")
    opts = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
    if opts.get("redis_type") not in (None, "redis"):
        raise ValueError("this reader reads a single Redis; clusters and sentinels read through Feast's online_read")
    return {"host": host or "localhost", "port": int(port or 6379), "password": opts.get("password"),
            "username": opts.get("username"), "db": int(opts.get("db", 0)),
            "ssl": opts.get("ssl", "false").lower() == "true"}


class RedisOnlineReader:
    def __init__(self, repo_config, views: list, connect_timeout: float = 0.2, read_timeout: float = 0.5,
                 breaker: CircuitBreaker | None = None):
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        store = repo_config.online_store
        kind = getattr(store, "redis_type", "redis")
        if getattr(kind, "value", kind) != "redis":
            raise ValueError(f"redis_type {kind}: this reader reads a single Redis (clusters read through Feast)")
        self.endpoint = parse_connection_string(store.connection_string)
        self.breaker = breaker or CircuitBreaker()
        # no retries inside redis-py: a failure opens the breaker at once instead of making the request wait
        self._client = redis.Redis(**self.endpoint, socket_connect_timeout=connect_timeout, socket_timeout=read_timeout,
                                   retry=Retry(NoBackoff(), 0), retry_on_timeout=False, health_check_interval=0)
        self._errors = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, redis.exceptions.ResponseError, OSError)
        # one command instead of one HMGET per entity: a redis-py pipeline builds and parses a
        # Python object per command, which at a 256-request batch costs twice the raw socket
        # (bench/bench_redis_client.py); the script runs the same HMGETs inside Redis
        self._hmget_many = self._client.register_script(_HMGET_MANY)
        self._project = repo_config.project.encode()
        self._key_version = repo_config.entity_key_serialization_version
        self._templates: dict[str, tuple[bytes, bytes] | None] = {}
        self._fields: dict[str, list[bytes]] = {
            view.name: [field_key(_fv_name(view, repo_config), f.name) for f in view.features] for view in views}

    def _call(self, fn):
        """Run `fn(client)`; any Redis or network failure opens the breaker."""
        if not self.breaker.allow():
            raise OnlineStoreUnavailable(f"online store unavailable ({self.breaker.error}); retrying in a moment")
        try:
            out = fn(self._client)
        except self._errors as exc:  # refused, reset, timed out, an error reply (e.g. WRONGTYPE)
            self._client.connection_pool.disconnect()
            self.breaker.failure(exc)
            raise OnlineStoreUnavailable(f"online store unavailable: {type(exc).__name__}: {exc}") from exc
        self.breaker.success()
        return out

    def ping(self) -> None:
        self._call(lambda c: c.ping())

    def close(self) -> None:
        self._client.close()

    def _keys(self, join_key: str, ids: list[int]) -> list[bytes]:
        if join_key not in self._templates:
            self._templates[join_key] = key_template(join_key, self._key_version)
        project = self._project
        return [k + project for k in encode_keys(join_key, ids, self._key_version, self._templates[join_key])]

    def read_many(self, wanted: list[tuple[str, str, list[str], list[int]]]) -> list[dict[int, np.ndarray]]:
        """[(view, join key, features, ids)] -> per item: id -> values in the view's feature order
        (all NaN for an entity the store lacks). Every view's reads go in one round trip."""
        keys: list[bytes] = []
        args: list = []
        for view, join_key, _, ids in wanted:  # per view: its field count, its key count, its fields
            fields = self._fields[view]
            keys += self._keys(join_key, ids)
            args += [len(fields), len(ids), *fields]
        flat = _numbers(self._call(lambda client: self._hmget_many(keys=keys, args=args, client=client)))
        out, at = [], 0
        for view, _, _, ids in wanted:
            size = len(ids) * len(self._fields[view])
            out.append(dict(zip(ids, flat[at:at + size].reshape(len(ids), -1))))
            at += size
        return out


_HMGET_MANY = """
local out, n, a, k = {}, 0, 1, 0
while a <= #ARGV do
  local nf, nk = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local fields = {unpack(ARGV, a + 2, a + 1 + nf)}
  for _ = 1, nk do
    k = k + 1
    for _, v in ipairs(redis.call('HMGET', KEYS[k], unpack(fields))) do
      n = n + 1
      out[n] = v
    end
  end
  a = a + 2 + nf
end
return out
"""
"""Every view's HMGETs in one call. ARGV, per view: its field count, its key count, its fields;
KEYS: the views' keys in the same order. A missing field is false in Lua and nil in the reply,
so the flat reply lines up with (key, field)."""

_MEMO: dict = {None: np.nan}  # serialized Value -> float: counts and rates repeat across entities
_MEMO_MAX = 200_000


def _numbers(values: list) -> np.ndarray:
    """Serialized Values (None: absent) -> floats, through the memo (one dict lookup per value)."""
    get = _MEMO.get
    out = [get(v) for v in values]
    for i, v in enumerate(out):
        if v is None:  # not seen before
            out[i] = _MEMO[values[i]] = _number(values[i])
    if len(_MEMO) > _MEMO_MAX:
        _MEMO.clear()
        _MEMO[None] = np.nan
    return np.array(out, np.float64)


def _fv_name(view, repo_config) -> str:
    """The view's name as Feast's Redis store writes it (version-qualified when versioning is on)."""
    try:
        from feast.infra.online_stores.redis import _versioned_fv_name

        return _versioned_fv_name(view, repo_config)
    except ImportError:
        return view.name
