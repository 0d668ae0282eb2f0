"""Open the Feast store of a platform config and read online features (what serving calls)."""

from __future__ import annotations

from lattice.config import PlatformConfig
from lattice.paths import Paths

from features.notices import feast_experimental
from features.repo import feature_refs, feature_service_name, write_repo

__all__ = ["feast_experimental", "feature_service_name", "get_store", "online_features"]


def get_store(config: PlatformConfig, paths: Paths):
    """A `feast.FeatureStore` on `paths.feast_repo` (feature_store.yaml is written if missing)."""
    from feast import FeatureStore

    if not (paths.feast_repo / "feature_store.yaml").exists():
        write_repo(config, paths)
    return FeatureStore(repo_path=str(paths.feast_repo))


def online_features(config: PlatformConfig, paths: Paths, entity_rows: list[dict], service: str | None = None, store=None) -> dict:
    """Latest aggregate values for entity rows, e.g. [{"user_id": 7, "ad_id": 3}] -> {column: [values]}:
    the named FeatureService (a model version's), or every feature view of the config. Rows must
    carry every join key (an unknown entity gives None values)."""
    store = store or get_store(config, paths)
    with feast_experimental():
        features = store.get_feature_service(service) if service else feature_refs(config)
    keys = [f.column for f in config.entity_features
            if any(a.entity == f.name for a in config.features.aggregates)]
    missing = [k for k in keys if any(k not in row for row in entity_rows)]
    if missing:
        raise ValueError(f"entity rows need the join keys {keys}; missing {missing}")
    rows = [{k: int(row[k]) for k in keys} for row in entity_rows]
    with feast_experimental():
        return store.get_online_features(features=features, entity_rows=rows).to_dict()
