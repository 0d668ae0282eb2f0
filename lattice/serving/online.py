"""Entity features from the Feast online store (SQLite by default, Redis when configured).

Returns the aggregate columns for each request's entities; an entity the store has never seen
gets the defaults training used for an entity without history (0 for every count and rate) and
is listed in the response's `unknown_entities`.
"""

from __future__ import annotations

import logging
import threading

import numpy as np

from lattice.config import PlatformConfig
from lattice.data import schema as S
from lattice.paths import Paths

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
        self._views: list = []
        self._lock = threading.Lock()

    def _open(self) -> None:
        from features.store import get_store

        self._store = get_store(self.config, self.paths)
        # Per-request Feast `get_online_features` re-resolves the feature service from the registry
        # (protobuf -> FeatureView objects with runtime type checks), about 1 ms per view per call.
        # The views do not change while a server runs, so resolve them once and read the online
        # store through its provider (the same `online_read` that get_online_features ends in).
        try:
            self._provider = self._store._get_provider()
            self._views = [self._store.get_feature_view(a.name) for a in self.config.features.aggregates]
        except Exception as exc:  # another Feast version: fall back to the public (slower) call
            log.warning("direct online reads unavailable (%s); using get_online_features", exc)
            self._provider = None

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
        from feast.protos.feast.types.EntityKey_pb2 import EntityKey
        from feast.protos.feast.types.Value_pb2 import Value

        out: dict[str, list] = {}
        for view in self._views:
            (key,) = view.join_keys
            feats = [f.name for f in view.features]
            ids = [int(r[key]) for r in rows]
            unique = list(dict.fromkeys(ids))  # a batch often repeats an entity: read it once
            keys = [EntityKey(join_keys=[key], entity_values=[Value(int64_val=i)]) for i in unique]
            got = self._provider.online_read(config=self._store.config, table=view, entity_keys=keys, requested_features=feats)
            by_id = dict(zip(unique, (values for _, values in got)))
            for f in feats:
                vals = {}
                for i, values in by_id.items():
                    v = values.get(f) if values else None
                    kind = v.WhichOneof("val") if v is not None else None
                    vals[i] = None if kind is None else getattr(v, kind)
                out[f] = [vals[i] for i in ids]
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
            out[c] = np.array([np.nan if v is None else float(v) for v in vals], dtype=np.float64)
        for key in self.entity_keys:
            missing = np.all(np.stack([np.isnan(out[c]) for c, k in self.columns.items() if k == key]), axis=0)
            for i in np.flatnonzero(missing):
                unknown[i].append(key)
        return {c: np.nan_to_num(v, nan=0.0) for c, v in out.items()}, unknown
