"""Entity features from the Feast online store (SQLite by default, Redis when configured).

Returns the aggregate columns for each request's entities; an entity the store has never seen
gets the defaults training used for an entity without history (0 for every count and rate) and
is listed in the response's `unknown_entities`.

Two ways to read, chosen when the store opens:
- mirror (SQLite store with at most `serving.online_mirror_entities` entities per view): every
  view is held in memory as sorted ids + a value matrix, loaded at startup; each lookup checks
  SQLite's `data_version` (a few microseconds) and, when a materialization has committed since the
  copy was taken, reloads it in a background thread while requests keep using the old copy (a
  store that could not be held, e.g. not materialized yet, is tried again at its next change).
- on demand (larger stores, Redis, the mirror off): entities are read from the store and cached per
  (feature view, entity), unknown entities included; the cache is emptied every
  `serving.feature_cache_seconds` (and when it holds `serving.feature_cache_entries`), so no value
  served is older than that, and a hit costs one dict lookup. Redis is read with redis_online.py
  (every view's misses in one round trip).

When the online store cannot be read (Redis down or timing out; its circuit breaker then spares
the next requests the wait), a request is still answered: entities still in the cache get their
cached values, the others the no-history defaults and a place in `unknown_entities`; nothing
read in that state is cached, so fresh values come back with the store. `health()` (in /healthz)
names the store and says it is unavailable meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from lattice.config import PlatformConfig
from lattice.data import schema as S
from lattice.paths import Paths
from lattice.serving.redis_online import OnlineStoreUnavailable, RedisOnlineReader
from lattice.serving.sqlite_online import SqliteOnlineReader, ViewTable, value_number

log = logging.getLogger(__name__)


class OnlineFeatures:
    def __init__(self, config: PlatformConfig, paths: Paths):
        self.config = config
        self.paths = paths
        entity_column = {f.name: f.column for f in config.entity_features}
        # aggregate column -> the entity key (canonical column) it is keyed by
        self.columns: dict[str, str] = {
            f"{a.name}_{stat}_{w}": entity_column[a.entity]
            for a in config.features.aggregates for w in a.windows for stat in a.statistics
        }
        self.entity_keys = sorted(set(self.columns.values()))
        self._store = None
        self._provider = None
        self._sqlite = None  # SqliteOnlineReader when the online store is Feast's SQLite
        self._redis: RedisOnlineReader | None = None  # when it is a single Redis
        self.fallbacks = 0  # entity reads answered without the store (it was unavailable)
        self._views: list = []
        # one SQLite connection is shared by the request threads; a mirror reload loads outside
        # the lock and takes it only to swap (re-entrant: the first load runs while opening)
        self._lock = threading.RLock()
        self._cache_seconds = config.serving.feature_cache_seconds
        self._cache_entries = config.serving.feature_cache_entries
        self._cache: dict[str, dict[int, np.ndarray]] = {}  # view -> entity id -> values (NaN = absent)
        self._cache_until = 0.0
        self._cached = 0  # entries in the cache (kept as a count: summing the views' sizes per call costs)
        self._mirror_entities = config.serving.online_mirror_entities
        self._mirror: dict[str, ViewTable] | None = None  # view name -> the whole view, when mirrored
        self._mirror_version: int | None = None  # the store's data_version the mirror was loaded at
        self._reloading: threading.Thread | None = None
        self.reads = 0  # entity reads that went to the store (the rest came from the cache or the mirror)
        self.reloads = 0  # mirror reloads after the store changed

    def _open(self) -> None:
        self._store = _open_store(self.config, self.paths)
        # Per-request Feast `get_online_features` re-resolves the feature service from the registry
        # (protobuf -> FeatureView objects with runtime type checks), about 1 ms per view per call.
        # The views do not change while a server runs, so resolve them once and read the online
        # store through its provider (the same `online_read` that get_online_features ends in).
        try:
            self._provider = self._store._get_provider()
            views = [self._store.get_feature_view(a.name) for a in self.config.features.aggregates]
            self._views = [(v, v.join_keys[0], [f.name for f in v.features]) for v in views]
        except Exception as exc:  # another Feast version: fall back to the public (slower) call
            log.warning("direct online reads unavailable (%s); using get_online_features", exc)
            self._provider = None
            return
        if self._store.config.online_store.type == "redis":
            try:
                self._redis = RedisOnlineReader(self._store.config, [v for v, _, _ in self._views])
            except Exception as exc:  # TLS, a cluster: Feast's own online_read still works
                log.warning("batch Redis reads unavailable (%s); reading through Feast's online_read", exc)
        if self._store.config.online_store.type == "sqlite":
            try:
                self._sqlite = SqliteOnlineReader(self._store.config, [v for v, _, _ in self._views])
            except Exception as exc:  # no database yet, another layout: the provider still works
                log.warning("batch SQLite reads unavailable (%s); reading through Feast's online_read", exc)
                return
            if self._mirror_entities > 0:
                self._load_mirror(self._sqlite.data_version())

    @property
    def mode(self) -> str:
        """How entities are read: mirror, cache (on demand, cached) or direct (on demand)."""
        return "mirror" if self._mirror is not None else "cache" if self._cache_seconds > 0 else "direct"

    def _load_mirror(self, version: int) -> None:
        """Load every view into memory, as of `version` of the store (or later); if a view is too
        large or cannot be decoded, drop the mirror and read on demand."""
        try:
            tables = {v.name: self._sqlite.read_view(v.name, key, feats, self._mirror_entities) for v, key, feats in self._views}
        except Exception as exc:  # a table not materialized yet, a locked file: on-demand reads still work
            log.warning("in-memory online features unavailable (%s); reading entities on demand", exc)
            tables = {"": None}
        with self._lock:
            if any(t is None for t in tables.values()):
                if self._mirror is not None or self._mirror_version is None:
                    log.info("online store views exceed serving.online_mirror_entities=%d or use another key encoding: "
                             "reading entities on demand", self._mirror_entities)
                self._mirror = None
                self._cache, self._cached = {}, 0  # not filled while mirrored; start clean
            else:
                self._mirror = tables
                log.info("online features in memory: %s", ", ".join(f"{n} {len(t.ids):,} entities" for n, t in tables.items()))
            self._mirror_version = version

    def _reload(self, version: int) -> None:
        self._load_mirror(version)
        self.reloads += 1

    def check_service(self, name: str | None, what: str) -> None:
        """The FeatureService a model version was registered with (`name`) must exist in the store
        and hold exactly the aggregate columns this reader serves; `what` names the version in
        the error. A version without one (no aggregates) passes only when none are served."""
        if not name:
            if self.columns:
                raise LookupError(f"{what} records no feature service, but the config serves {len(self.columns)} aggregate "
                                  "columns; register the model again")
            return
        with self._lock:
            if self._store is None:
                self._open()
            service = self._store.get_feature_service(name)  # FeatureServiceNotFoundException names it
        got = {f.name for p in service.feature_view_projections for f in p.features}
        if got != set(self.columns):
            raise LookupError(f"{what}: feature service {name!r} holds {sorted(got ^ set(self.columns))} that the served "
                              f"columns {'lack' if got - set(self.columns) else 'add'}; serve it with the config it was registered with")

    def open(self) -> None:
        """Open the store now (the server calls this at startup, so the first request does not
        pay for reading the Feast registry)."""
        with self._lock:
            if self._store is None:
                self._open()

    def _fetch(self, ids: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """entity key -> (n,) int64 ids  =>  aggregate column -> (n,) float64, NaN where absent."""
        from features.store import online_features

        with self._lock:  # one SQLite connection is shared by the request threads
            if self._store is None:  # opening the store reads its registry: once per process, not per request
                self._open()
            if self._provider is None:
                n = len(next(iter(ids.values())))
                rows = [{k: int(v[i]) for k, v in ids.items()} for i in range(n)]
                got = online_features(self.config, self.paths, rows, store=self._store)
                return {c: np.array([np.nan if v is None else float(v) for v in got[c]], np.float64) for c in self.columns}
            if self._sqlite is not None and self._mirror_entities > 0:
                version = self._sqlite.data_version()
                if version != self._mirror_version and (self._reloading is None or not self._reloading.is_alive()):
                    # the store changed: (re)load in the background and keep answering from the old
                    # copy, or on demand when there is none yet (a first materialization, a failed load)
                    self._reloading = threading.Thread(target=self._reload, args=(version,), name="online-mirror", daemon=True)
                    self._reloading.start()
            mirror = self._mirror
            if mirror is not None:
                return self._read_mirror(mirror, ids)
            return self._read_direct(ids)

    def _read_mirror(self, mirror: dict[str, ViewTable], ids: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for view, key, feats in self._views:
            matrix = mirror[view.name].get(ids[key])
            for j, f in enumerate(feats):
                out[f] = matrix[:, j]
        return out

    def _view_cache(self, name: str) -> dict[int, np.ndarray] | None:
        if self._cache_seconds <= 0:
            return None
        now = time.monotonic()
        if now >= self._cache_until or self._cached >= self._cache_entries:
            self._cache, self._cached = {}, 0
            self._cache_until = now + self._cache_seconds
        return self._cache.setdefault(name, {})

    def _read_direct(self, ids: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        plan = []  # per view: (view, key, feats, unique ids, inverse, cache, cached rows, missing ids)
        for view, key, feats in self._views:
            uniq, inverse = np.unique(ids[key], return_inverse=True)  # a batch often repeats an entity: read it once
            keys = uniq.tolist()
            cache = self._view_cache(view.name)
            rows = [cache.get(i) for i in keys] if cache is not None else [None] * len(keys)
            plan.append((view, key, feats, keys, inverse, cache, rows, [i for i, r in zip(keys, rows) if r is None]))
        wanted = [(view, key, feats, missing) for view, key, feats, _, _, _, _, missing in plan if missing]
        try:
            fresh = iter(self._read_views(wanted))
            store_ok = True
        except OnlineStoreUnavailable as exc:
            log.debug("online store unavailable, answering from the cache and defaults: %s", exc)
            self.fallbacks += sum(len(m) for _, _, _, m in wanted)
            store_ok = False
        out: dict[str, np.ndarray] = {}
        for view, key, feats, keys, inverse, cache, rows, missing in plan:
            if missing:
                got = next(fresh) if store_ok else {}
                if cache is not None and store_ok:  # never cache a fallback: fresh values return with the store
                    cache.update(got)
                    self._cached += len(got)
                absent = np.full(len(feats), np.nan)
                rows = [got.get(i, absent) if r is None else r for i, r in zip(keys, rows)]
            matrix = np.vstack(rows)[inverse.reshape(-1)]
            for j, f in enumerate(feats):
                out[f] = matrix[:, j]
        return out

    def _read_views(self, wanted: list) -> list[dict[int, np.ndarray]]:
        if not wanted:
            return []
        if self._redis is not None:
            self.reads += sum(len(ids) for *_, ids in wanted)
            return self._redis.read_many([(view.name, key, feats, ids) for view, key, feats, ids in wanted])
        try:
            return [self._read_view(view, key, feats, ids) for view, key, feats, ids in wanted]
        except (OSError, *_redis_errors()) as exc:  # Feast's Redis store through redis-py (TLS, clusters)
            raise OnlineStoreUnavailable(f"online store unavailable: {type(exc).__name__}: {exc}") from exc

    def _read_view(self, view, key: str, feats: list[str], ids: list[int]) -> dict[int, np.ndarray]:
        """entity id -> feature values in `feats` order (all NaN for an entity the store lacks)."""
        from feast.protos.feast.types.EntityKey_pb2 import EntityKey
        from feast.protos.feast.types.Value_pb2 import Value

        self.reads += len(ids)
        if self._sqlite is not None:
            return self._sqlite.read(view.name, key, feats, ids)
        keys = [EntityKey(join_keys=[key], entity_values=[Value(int64_val=i)]) for i in ids]
        got = self._provider.online_read(config=self._store.config, table=view, entity_keys=keys, requested_features=feats)
        out: dict[int, np.ndarray] = {}
        for i, (_, values) in zip(ids, got):
            out[i] = np.array([value_number((values or {}).get(f)) for f in feats], np.float64)
        return out

    def health(self) -> dict:
        """The online store as /healthz reports it: its type and whether it can be read now."""
        kind = self._store.config.online_store.type if self._store is not None else None
        out = {"store": kind, "status": "ok", "mode": self.mode}
        if self._redis is not None:
            breaker = self._redis.breaker
            if breaker.allow():  # a closed breaker, or one whose cool-down has passed: ask Redis
                with self._lock:
                    try:
                        self._redis.ping()
                    except OnlineStoreUnavailable:
                        pass
            if breaker.open:
                out.update(status="unavailable", error=breaker.error, failures=breaker.failures,
                           since=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(breaker.since or time.time())),
                           fallback="cached values while they last, else no-history defaults listed in unknown_entities")
        out["fallback_reads"] = self.fallbacks
        return out

    def lookup(self, entities: list[dict[str, object]]) -> tuple[dict[str, np.ndarray], list[list[str]]]:
        """Raw entity keys per request -> see `lookup_ids`."""
        ids = {k: np.array([S.stable_id(str(e[k])) for e in entities], np.int64) for k in self.entity_keys}
        return self.lookup_ids(ids, len(entities))

    def lookup_ids(self, ids: dict[str, np.ndarray], n: int | None = None) -> tuple[dict[str, np.ndarray], list[list[str]]]:
        """entity key -> (n,) hashed ids  =>  (aggregate column -> (n,) values with defaults filled
        in, unknown entity keys per request)."""
        n = len(next(iter(ids.values()))) if n is None else n
        unknown: list[list[str]] = [[] for _ in range(n)]
        if not self.columns:
            return {}, unknown
        got = self._fetch(ids)
        out: dict[str, np.ndarray] = {}
        for c in self.columns:
            if c not in got:
                raise KeyError(f"the online store returned no column {c!r}; re-run the feature stage (feast apply + materialize)")
            out[c] = got[c]
        for key in self.entity_keys:
            missing = np.all(np.stack([np.isnan(out[c]) for c, k in self.columns.items() if k == key]), axis=0)
            for i in np.flatnonzero(missing).tolist():
                unknown[i].append(key)
        # copies: the columns share rows with the cache, which must keep its NaNs. np.where, not
        # np.nan_to_num: a third of its cost per column, which a single request pays per aggregate
        # (an inf stays inf here instead of becoming the float maximum; the dense transform clips
        # both to the same train bound)
        return {c: np.where(np.isnan(v), 0.0, v) for c, v in out.items()}, unknown


def _redis_errors() -> tuple:
    try:
        from redis.exceptions import ConnectionError, TimeoutError

        return ConnectionError, TimeoutError
    except ImportError:
        return ()


def _open_store(config: PlatformConfig, paths: Paths):
    """The Feast store serving reads. Under the scale-out profile it is built from the profile as
    it is now (not from a feature_store.yaml an earlier run left), so a moved Redis or registry
    is picked up by a restart alone."""
    from features.store import get_store

    from lattice.deploy.profile import services

    if not services(config).scale_out:
        return get_store(config, paths)
    from feast import FeatureStore
    from feast.repo_config import RepoConfig

    from features.repo import store_config

    repo_config = RepoConfig(**store_config(config, paths))
    repo_config.repo_path = paths.feast_repo
    return FeatureStore(repo_path=str(paths.feast_repo), config=repo_config)
