"""One Feast FeatureService per registered model version, on a real Feast repo (file offline
store, SQLite online store): the service is named after the version, and serving's check finds
the served version's own service or refuses the version with a message naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from lattice.config import load_config
from lattice.paths import Paths

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def applied(tmp_path_factory):
    from features.repo import apply_feature_service
    from features.store import get_store
    from pipelines.feast_jobs import feast_apply

    config = load_config(ROOT / "configs" / "demo.yaml")
    paths = Paths.for_config(config, tmp_path_factory.mktemp("feast") / "wd")
    summary = feast_apply(config, paths)
    assert summary["feature_services"] == []  # the views come first; services come with model versions
    store = get_store(config, paths)
    names = [apply_feature_service(config, paths, store, 1), apply_feature_service(config, paths, store, 2),
             apply_feature_service(config, paths, store, 1, model="teacher")]
    return config, paths, names


def test_a_service_per_version_holds_every_aggregate_column(applied):
    from features.store import get_store
    from lattice.data import schema as S

    config, paths, names = applied
    assert names == ["demo_v1", "demo_v2", "demo_teacher_v1"]
    store = get_store(config, paths)
    assert sorted(s.name for s in store.list_feature_services()) == sorted(names)
    v2 = store.get_feature_service("demo_v2")
    assert v2.tags == {"version": "2", "model": "student"}
    assert sorted(f.name for p in v2.feature_view_projections for f in p.features) == sorted(S.aggregate_columns(config))


def test_serving_looks_up_the_service_of_the_version_it_serves(applied):
    from features.store import get_store
    from lattice.serving.online import OnlineFeatures

    config, paths, _ = applied
    online = OnlineFeatures(config, paths)
    online.check_service("demo_v2", "demo_ranker v2")  # present, same columns: no error
    with pytest.raises(Exception, match="demo_v7"):
        online.check_service("demo_v7", "demo_ranker v7")  # never registered
    with pytest.raises(LookupError, match="records no feature service"):
        online.check_service("", "demo_ranker v3")

    from feast import FeatureService

    store = get_store(config, paths)
    first = store.get_feature_view(config.features.aggregates[0].name)
    store.apply([FeatureService(name="demo_v9", features=[first])])  # a version trained on fewer features
    with pytest.raises(LookupError, match="demo_v9"):
        online.check_service("demo_v9", "demo_ranker v9")


def test_the_repo_file_for_the_feast_cli_declares_the_versions_services(applied, monkeypatch):
    """`feast apply` in the repo deletes what definitions.py does not declare: the services of
    registered versions must be in it."""
    import runpy

    config, paths, names = applied
    monkeypatch.setenv("LATTICE_CONFIG", str(ROOT / "configs" / "demo.yaml"))
    declared = runpy.run_path(str(paths.feast_repo / "definitions.py"))
    services = sorted(o.name for k, o in declared.items() if k.startswith("obj_") and type(o).__name__ == "FeatureService")
    from features.store import get_store

    assert services == sorted(s.name for s in get_store(config, paths).list_feature_services())
    assert set(names) <= set(services)  # (another test here may have added one)
