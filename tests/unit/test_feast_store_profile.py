"""features.repo.store_config under the scale-out profile: Redis, the SQL registry and the Spark
master come from the profile file; the yaml that holds their passwords is owner-only."""

from __future__ import annotations

import stat

import yaml

from lattice.config import load_config
from lattice.config.schema import Deployment
from lattice.deploy.profile import write_profile
from lattice.paths import Paths


def test_scale_out_store_config_comes_from_the_profile(root, tmp_path, monkeypatch):
    from features.repo import store_config, write_repo

    monkeypatch.delenv("LATTICE_PROFILE_FILE", raising=False)
    profile = tmp_path / "secrets" / "profile.json"
    write_profile(profile, {
        "spark": {"master": "spark://127.0.0.1:7999"},
        "postgres": {"host": "127.0.0.1", "port": 5999, "user": "lattice", "password": "pgsecret",
                     "databases": {"feast": "lattice_feast"}},
        "redis": {"host": "127.0.0.1", "port": 6999, "password": "0123"},
    })
    demo = load_config(root / "configs" / "demo.yaml")
    cfg = demo.model_copy(update={"deployment": Deployment(profile="scale-out", profile_file=str(profile))})
    paths = Paths(workdir=tmp_path / "wd", data_root=tmp_path)
    conf = store_config(cfg, paths)
    assert conf["online_store"] == {"type": "redis", "connection_string": "127.0.0.1:6999,password=0123,db=0"}
    reg = conf["registry"]
    assert reg["registry_type"] == "sql" and reg["path"].startswith("postgresql+psycopg2://lattice:")
    assert reg["path"].endswith("@127.0.0.1:5999/lattice_feast") and reg["serve_features_while_materializing"]
    assert conf["offline_store"]["spark_conf"]["spark.master"] == "spark://127.0.0.1:7999"
    # Feast reads these keys as its SQL registry and Redis store configs
    from feast.repo_config import RepoConfig

    rc = RepoConfig(**conf)
    assert type(rc.registry).__name__ == "SqlRegistryConfig" and rc.online_store.type == "redis"
    yaml_file = write_repo(cfg, paths) / "feature_store.yaml"
    assert stat.S_IMODE(yaml_file.stat().st_mode) == 0o600
    assert yaml.safe_load(yaml_file.read_text())["registry"]["registry_type"] == "sql"
    # the embedded config is untouched by the profile
    plain = store_config(demo, paths)
    assert plain["online_store"]["type"] == "sqlite" and isinstance(plain["registry"], str)
    assert plain["offline_store"]["spark_conf"]["spark.master"] == "local[2]"
