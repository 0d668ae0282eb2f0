"""Entity features from the Feast online store (SQLite by default, Redis when configured).

Returns the aggregate columns for each request's entities; an entity the store has never seen
gets the defaults training used for an entity without history (0 for every count and rate) and
is listed in the response's `unknown_entities`. Values read from the store are cached per
(feature view, entity), unknown entities included; the cache is emptied every
`serving.feature_cache_seconds` (and when it holds `serving.feature_cache_entries`), so no value
served is older than that, and a hit costs one dict lookup.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from lattice.config import PlatformConfig
from lattice.data import schema as S
from lattice.paths import Paths
from lattice.serving.sqlite_online import SqliteOnlineReader, value_number

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
        self._views: list = []
        self._lock = threading.Lock()
        self._cache_seconds = config.serving.feature_cache_seconds
        self._cache_entries = config.serving.feature_cache_entries
        self._cache: dict[str, dict[int, np.ndarray]] = {}  # view -> entity id -> values (NaN = absent)
        self._cache_until = 0.0
        self.reads = 0  # entity reads that went to the store (the rest came from the cache)

    def _open(self) -> None:
        from features.store import get_store

        self._store = get_store(self.config, self.paths)
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
        if self._store.config.online_store.type == "sqlite":

            try:
                self._sqlite = SqliteOnlineReader(self._store.config, [v for v, _, _ in self._views])
            except Exception as exc:  # no database yet, another layout: the provider still works
                log.warning("batch SQLite reads unavailable (%s); reading through Feast's online_read", exc)

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
            return self._read_direct(ids)

    def _view_cache(self, name: str) -> dict[int, np.ndarray] | None:
        if self._cache_seconds <= 0:
            return None
        now = time.monotonic()
        if now >= self._cache_until or sum(map(len, self._cache.values())) >= self._cache_entries:
            self._cache = {}
            self._cache_until = now + self._cache_seconds
        return self._cache.setdefault(name, {})

    def _read_direct(self, ids: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for view, key, feats in self._views:
            uniq, inverse = np.unique(ids[key], return_inverse=True)  # a batch often repeats an entity: read it once
            keys = uniq.tolist()
            cache = self._view_cache(view.name)
            rows = [cache.get(i) for i in keys] if cache is not None else [None] * len(keys)
            missing = [i for i, r in zip(keys, rows) if r is None]
            if missing:
                fresh = self._read_view(view, key, feats, missing)
                if cache is not None:
                    cache.update(fresh)
                rows = [fresh[i] if r is None else r for i, r in zip(keys, rows)]
            matrix = np.vstack(rows)[inverse.reshape(-1)]
            for j, f in enumerate(feats):
                out[f] = matrix[:, j]
        return out

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
        # copies: the columns share rows with the cache, which must keep its NaNs
        return {c: np.nan_to_num(v, nan=0.0) for c, v in out.items()}, unknown
