"""Fast checks of the feature pipeline's pure parts (no Spark, no Feast runtime)."""

from __future__ import annotations

import json

import pytest
import yaml

from lattice.config import load_config
from lattice.data import schema as S
from lattice.paths import Paths


@pytest.fixture
def demo(root):
    return load_config(root / "configs" / "demo.yaml")


def test_expand_braces():
    from pipelines.sources import expand_braces

    assert expand_braces("/d/{dev,test}.csv") == ["/d/dev.csv", "/d/test.csv"]
    assert expand_braces("{a,b}/{x,y}") == ["a/x", "a/y", "b/x", "b/y"]
    assert expand_braces("plain/*.csv") == ["plain/*.csv"]


def test_source_columns_and_errors(tmp_path, demo):
    from pipelines.sources import SourceError, source_columns, source_files

    feed = next(s for s in demo.sources if s.name == "feed_log")
    paths = Paths(workdir=tmp_path / "wd", data_root=tmp_path)
    with pytest.raises(SourceError, match=r"feed_log.*no file matches .*feed/\*\.csv"):
        source_files(paths, feed)
    (tmp_path / "feed").mkdir()
    good = "uid,aid,ts,device_type,slot,user_seg,ad_cat,price,user_activity,clicked,converted,p_click,p_conversion\n"
    (tmp_path / "feed" / "a.csv").write_text(good)
    files = source_files(paths, feed)
    assert source_columns(feed, files)[:3] == ["uid", "aid", "ts"]
    (tmp_path / "feed" / "b.csv").write_text(good.replace("price,", ""))
    with pytest.raises(SourceError, match=r"b\.csv lacks column\(s\) \['price'\]"):
        source_columns(feed, source_files(paths, feed))


def test_schema_drift_record_and_reject(tmp_path, demo):
    from pipelines.sources import SourceError, check_schema_drift

    src = demo.sources[0]
    paths = Paths(workdir=tmp_path, data_root=tmp_path)
    assert check_schema_drift(paths, src, ["a", "b"]) == []
    assert check_schema_drift(paths, src, ["a", "b", "c"]) == ["c"]
    with pytest.raises(SourceError, match=r"lost column\(s\) \['b'\]"):
        check_schema_drift(paths, src, ["a", "c"])
    assert json.loads((tmp_path / "source_schemas.json").read_text())[src.name] == ["a", "b", "c"]


def test_run_window(demo):
    from pipelines.consolidate import run_window

    assert run_window(demo, None, None) is None
    lo, hi = run_window(demo, "2026-01-03", "2026-01-04")
    assert (lo.day, hi.day) == (3, 4)
    with pytest.raises(ValueError, match="exclusive"):
        run_window(demo, "2026-01-04", "2026-01-04")


def test_aggregate_feature_columns_follow_schema_contract(demo):
    from pipelines.aggregates import feature_columns

    cols = [c for a in demo.features.aggregates for c, _ in feature_columns(a)]
    assert sorted(cols) == sorted(S.aggregate_columns(demo))
    assert all(kind == ("rate" if "_rate_" in c else "int") for a in demo.features.aggregates for c, kind in feature_columns(a))


def test_feature_service_name(demo):
    from features.store import feature_service_name

    assert feature_service_name(demo) == "demo_v1"
    assert feature_service_name(demo, 3) == "demo_v3"
    assert feature_service_name(demo, 3, "student@noteacher") == "demo_v3"  # every student is a version of one model
    assert feature_service_name(demo, 2, "teacher") == "demo_teacher_v2"  # teachers count their own versions
    with pytest.raises(ValueError):
        feature_service_name(demo, 0)


def test_feature_store_yaml_sqlite_redis_spark(tmp_path, demo):
    from features.repo import write_repo

    paths = Paths(workdir=tmp_path, data_root=tmp_path)
    repo = write_repo(demo, paths)
    conf = yaml.safe_load((repo / "feature_store.yaml").read_text())
    assert conf["online_store"] == {"type": "sqlite", "path": str(tmp_path / "feast" / "data" / "online_store.db")}
    assert conf["offline_store"]["type"] == "spark" and conf["offline_store"]["spark_conf"]["spark.sql.session.timeZone"] == "UTC"
    assert conf["project"] == "demo"
    fs = demo.feature_store.model_copy(update={"online_store": "redis", "redis_url": "redis.local:6380", "offline_store": "file"})
    cfg = demo.model_copy(update={"feature_store": fs})
    conf = yaml.safe_load((write_repo(cfg, paths) / "feature_store.yaml").read_text())
    assert conf["online_store"] == {"type": "redis", "connection_string": "redis.local:6380"}
    assert conf["offline_store"] == {"type": "file"}


def test_feast_objects_built_from_config(tmp_path, demo):
    from features.repo import definitions, feature_service

    paths = Paths(workdir=tmp_path, data_root=tmp_path)
    objs = [*definitions(demo, paths), feature_service(demo, paths, 2)]  # the service comes with a model version
    names = {type(o).__name__: [] for o in objs}
    for o in objs:
        names[type(o).__name__].append(o.name)
    assert sorted(names["Entity"]) == ["ad_id", "user_id"]
    assert sorted(names["FeatureView"]) == ["ad_click", "user_click"]
    assert names["FeatureService"] == ["demo_v2"]
    view = next(o for o in objs if type(o).__name__ == "FeatureView" and o.name == "user_click")
    assert sorted(f.name for f in view.features) == sorted(c for c in S.aggregate_columns(demo) if c.startswith("user_click_"))
    assert view.entities == ["user_id"]


def test_stage_registry_lists_feature_stages():
    from lattice.stages import STAGES, get_stage

    for name in ("features", "consolidate", "aggregates", "feast_apply", "training_set", "materialize"):
        assert name in STAGES
        assert callable(get_stage(name))
