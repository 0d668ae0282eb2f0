"""Build the Feast repo of a platform config: `feature_store.yaml` in `paths.feast_repo` and the
Feast objects (entities, feature views, feature services). Nothing here is per-config code: a new
domain, entity or aggregate in the YAML shows up as a new entity or view on the next apply."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from lattice.config import PlatformConfig
from lattice.paths import Paths

SPARK_CONF = {
    "spark.master": "local[2]",
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
}


SERVABLE = "student"


def feature_service_name(config: PlatformConfig, version: int = 1, model: str = SERVABLE) -> str:
    """The FeatureService of one registered model version: `<config>_v<N>` for version N of the
    served (student) model, `<config>_<kind>_v<N>` for a teacher's or baseline's own versions
    (their version numbers count separately). The register stage applies it and records the
    name on the version; serving looks up the one of the version it serves."""
    if version < 1:
        raise ValueError(f"model versions start at 1, got {version}")
    kind = model.split("@")[0].split(":")[0]
    return f"{config.name}_v{version}" if kind == SERVABLE else f"{config.name}_{kind}_v{version}"


def feature_refs(config: PlatformConfig) -> list[str]:
    """`view:feature` of every aggregate column: what a training set is built from before any
    model version (and so its service) exists."""
    from lattice.data.schema import aggregate_feature_columns

    return [f"{a.name}:{c}" for a in config.features.aggregates for c, _ in aggregate_feature_columns(a)]


def project_name(config: PlatformConfig) -> str:
    return config.name


def store_config(config: PlatformConfig, paths: Paths) -> dict:
    """feature_store.yaml as a dict. Under `deployment.profile: scale-out` the deployment profile
    names the online store (Redis), the registry (Feast's SQL registry on PostgreSQL) and the
    Spark master of the offline store; otherwise the config's `feature_store` keys decide."""
    from lattice.deploy.profile import services

    data = paths.feast_repo / "data"
    fs = config.feature_store
    svc = services(config)
    if svc.feast_online_store is not None:
        online = dict(svc.feast_online_store)
    elif fs.online_store == "redis":
        online = {"type": "redis", "connection_string": fs.redis_url}
    else:
        online = {"type": "sqlite", "path": str(data / "online_store.db")}
    registry: str | dict = str(data / "registry.db")
    if svc.feast_registry is not None:
        # a registry shared by several servers: a materialization marks its views MATERIALIZING
        # in it, which must not stop the others from serving the last materialized values
        registry = {**svc.feast_registry, "serve_features_while_materializing": True}
    offline: dict = {"type": "file"}
    if fs.offline_store == "spark":
        # the driver Feast starts is set up as the platform's own (loopback, log4j2, no progress bar)
        from pipelines.spark import driver_conf

        offline = {"type": "spark", "spark_conf": {**SPARK_CONF, "spark.master": svc.spark_master,
                                                   **driver_conf(svc.spark_master)}}
    return {
        "project": project_name(config),
        "registry": registry,
        "provider": "local",
        "online_store": online,
        "offline_store": offline,
        "entity_key_serialization_version": 3,
    }


def holds_secrets(store: dict) -> bool:
    """Whether a store config carries credentials (a Redis password, a database URL)."""
    return isinstance(store["registry"], dict) or "password=" in str(store["online_store"].get("connection_string", ""))


def write_repo(config: PlatformConfig, paths: Paths) -> Path:
    """(Re)write feature_store.yaml and a definitions file that `feast apply` can also use."""
    repo = paths.feast_repo
    (repo / "data").mkdir(parents=True, exist_ok=True)
    store = store_config(config, paths)
    text = ("# generated from the platform config by features.repo.write_repo; edit the config, not this file\n"
            + yaml.safe_dump(store, sort_keys=False))
    target = repo / "feature_store.yaml"
    if holds_secrets(store):  # owner-only from the first byte, like the profile it comes from
        tmp = target.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, target)
    else:
        target.write_text(text)
    src = config.source_file or ""
    (repo / "definitions.py").write_text(
        '"""Feast definitions of this repo, built from the platform config (for the `feast` CLI)."""\n'
        "import os\n\n"
        "from lattice.config import load_config\n"
        "from lattice.paths import Paths\n"
        "from features.repo import definitions, registered_services\n\n"
        f"_config = load_config(os.environ.get('LATTICE_CONFIG', {src!r}))\n"
        f"_paths = Paths.for_config(_config, {str(paths.workdir)!r})\n"
        "# the model versions' services too: `feast apply` removes what the repo does not declare\n"
        "for _i, _obj in enumerate([*definitions(_config, _paths), *registered_services(_paths)]):\n"
        "    globals()[f'obj_{_i}'] = _obj\n")
    return repo


def entities(config: PlatformConfig) -> dict:
    from feast import Entity, ValueType

    return {f.name: Entity(name=f.name, join_keys=[f.column], value_type=ValueType.INT64,
                           description=f"sparse feature {f.name} (stable int64 id)")
            for f in config.entity_features}


def _source(config: PlatformConfig, paths: Paths, agg_name: str):
    path = str(paths.aggregate(agg_name))
    if config.feature_store.offline_store == "spark":
        from feast.infra.offline_stores.contrib.spark_offline_store.spark_source import SparkSource

        from features.notices import feast_experimental

        with feast_experimental():
            return SparkSource(name=f"{agg_name}_source", path=path, file_format="parquet",
                               timestamp_field="event_timestamp", created_timestamp_column="created")
    from feast import FileSource
    from feast.data_format import ParquetFormat

    return FileSource(name=f"{agg_name}_source", path=path, file_format=ParquetFormat(),
                      timestamp_field="event_timestamp", created_timestamp_column="created")


def feature_views(config: PlatformConfig, paths: Paths) -> list:
    from feast import FeatureView, Field
    from feast.types import Float64, Int64

    from lattice.data.schema import aggregate_feature_columns

    ents = entities(config)
    views = []
    for agg in config.features.aggregates:
        views.append(FeatureView(
            name=agg.name, entities=[ents[agg.entity]], ttl=config.feature_store.ttl_timedelta(),
            schema=[Field(name=c, dtype=Float64 if kind == "rate" else Int64) for c, kind in aggregate_feature_columns(agg)],
            source=_source(config, paths, agg.name), online=True,
            description=f"point-in-time {agg.objective} counts/rates per {agg.entity} over {', '.join(agg.windows)}",
            tags={"objective": agg.objective, "entity": agg.entity},
        ))
    return views


def feature_service(config: PlatformConfig, paths: Paths, version: int = 1, views: list | None = None, model: str = SERVABLE):
    from feast import FeatureService

    return FeatureService(name=feature_service_name(config, version, model), features=views if views is not None else feature_views(config, paths),
                          description=f"features of {model} version {version} of {config.name}",
                          tags={"version": str(version), "model": model})


def definitions(config: PlatformConfig, paths: Paths) -> list:
    """Entities and feature views; the feature services come with the model versions (`apply_feature_service`)."""
    return [*entities(config).values(), *feature_views(config, paths)]


def registered_services(paths: Paths) -> list:
    """The FeatureServices the register stage applied (none before the store exists)."""
    if not (paths.feast_repo / "feature_store.yaml").is_file():
        return []
    from feast import FeatureStore

    from features.notices import feast_experimental

    try:
        with feast_experimental():
            return list(FeatureStore(repo_path=str(paths.feast_repo)).list_feature_services())
    except Exception:  # no registry yet: nothing was registered
        return []


def apply_feature_service(config: PlatformConfig, paths: Paths, store, version: int, model: str = SERVABLE) -> str:
    """Apply the FeatureService of registered `model` version `version` (the config's feature
    views: what the model was trained on) to `store`; returns its name."""
    from features.notices import feast_experimental

    with feast_experimental():
        service = feature_service(config, paths, version, model=model)
        store.apply([service])  # partial: the other objects stay
    return service.name
