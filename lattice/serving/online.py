"""Entity features from the Feast online store (SQLite by default, Redis when configured).

Returns the aggregate columns for each request's entities; an entity the store has never seen
gets the defaults training used for an entity without history (0 for every count and rate) and
is listed in the response's `unknown_entities`. Values read from the store are kept for
`serving.feature_cache_seconds` per (feature view, entity), unknown entities included.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
from cachetools import TTLCache

from lattice.config import PlatformConfig
from lattice.data import schema as S
from lattice.paths import Paths

log = logging.getLogger(__name__)

_MISS = object()


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
        self._views: list = []
        self._lock = threading.Lock()
        sv = config.serving
        self._cache: TTLCache | None = (
            TTLCache(maxsize=sv.feature_cache_entries, ttl=sv.feature_cache_seconds) if sv.feature_cache_seconds > 0 else None)
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

    def open(self) -> None:
        """Open the store now (the server calls this at startup, so the first request does not
        pay for reading the Feast registry)."""
        with self._lock:
            if self._store is None:
                self._open()

    def _fetch(self, rows: list[dict[str, int]]) -> dict[str, list]:
        from features.store import online_features

        with self._lock:  # one SQLite connection is shared by the request threads
            if self._store is None:  # opening the store reads its registry: once per process, not per request
                self._open()
            if self._provider is None:
                got = online_features(self.config, self.paths, rows, store=self._store)
                return {c: got[c] for c in self.columns}
            return self._read_direct(rows)

    def _read_direct(self, rows: list[dict[str, int]]) -> dict[str, list]:
        out: dict[str, list] = {}
        for view, key, feats in self._views:
            ids = [int(r[key]) for r in rows]
            got: dict[int, tuple | None] = {}
            missing = []
            for i in dict.fromkeys(ids):  # a batch often repeats an entity: read it once
                hit = self._cache.get((view.name, i), _MISS) if self._cache is not None else _MISS
                if hit is _MISS:
                    missing.append(i)
                else:
                    got[i] = hit
            if missing:
                fresh = self._read_view(view, key, feats, missing)
                got.update(fresh)
                if self._cache is not None:
                    for i, values in fresh.items():
                        self._cache[(view.name, i)] = values
            for j, f in enumerate(feats):
                out[f] = [None if got[i] is None else got[i][j] for i in ids]
        return out

    def _read_view(self, view, key: str, feats: list[str], ids: list[int]) -> dict[int, tuple | None]:
        """entity id -> feature values in `feats` order (None for an entity the store lacks)."""
        from feast.protos.feast.types.EntityKey_pb2 import EntityKey
        from feast.protos.feast.types.Value_pb2 import Value

        self.reads += len(ids)
        keys = [EntityKey(join_keys=[key], entity_values=[Value(int64_val=i)]) for i in ids]
        got = self._provider.online_read(config=self._store.config, table=view, entity_keys=keys, requested_features=feats)
        out: dict[int, tuple | None] = {}
        for i, (_, values) in zip(ids, got):
            if not values:
                out[i] = None
                continue
            row = []
            for f in feats:
                v = values.get(f)
                kind = v.WhichOneof("val") if v is not None else None
                row.append(None if kind is None else getattr(v, kind))
            out[i] = tuple(row)
        return out

    def lookup(self, entities: list[dict[str, object]]) -> tuple[dict[str, np.ndarray], list[list[str]]]:
        """-> (aggregate column -> (n,) values with defaults filled in, unknown entity keys per request)."""
        n = len(entities)
        unknown: list[list[str]] = [[] for _ in range(n)]
        if not self.columns:
            return {}, unknown
        rows = [{k: S.stable_id(str(e[k])) for k in self.entity_keys} for e in entities]
        got = self._fetch(rows)
        out: dict[str, np.ndarray] = {}
        for c in self.columns:
            vals = got.get(c)
            if vals is None:
                raise KeyError(f"the online store returned no column {c!r}; re-run the feature stage (feast apply + materialize)")
            out[c] = np.fromiter((np.nan if v is None else float(v) for v in vals), np.float64, n)
        for key in self.entity_keys:
            missing = np.all(np.stack([np.isnan(out[c]) for c, k in self.columns.items() if k == key]), axis=0)
            for i in np.flatnonzero(missing):
                unknown[i].append(key)
        for v in out.values():
            v[np.isnan(v)] = 0.0
        return out, unknown
