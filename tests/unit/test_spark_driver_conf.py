"""Every Spark driver the platform starts, Feast's included, listens on loopback unless the
master is elsewhere, logs through the platform's log4j2 file and draws no progress bar."""

from __future__ import annotations

import os

import pytest

from lattice.config import load_config
from lattice.paths import Paths
from pipelines.spark import LOG4J2, driver_conf


@pytest.fixture(autouse=True)
def _no_driver_host(monkeypatch):
    monkeypatch.delenv("LATTICE_SPARK_DRIVER_HOST", raising=False)


@pytest.mark.parametrize("master", ["local[2]", "local[*]", "spark://127.0.0.1:7077", "spark://localhost:7077"])
def test_a_master_on_loopback_gets_a_loopback_driver(master):
    conf = driver_conf(master)
    assert conf["spark.driver.bindAddress"] == "127.0.0.1" and conf["spark.driver.host"] == "127.0.0.1"
    assert conf["spark.ui.showConsoleProgress"] == "false"
    assert conf["spark.driver.extraJavaOptions"] == f"-Dlog4j2.configurationFile={LOG4J2.as_uri()}"
    assert LOG4J2.is_file()


def test_a_remote_master_leaves_the_address_to_its_environment(monkeypatch):
    assert "spark.driver.bindAddress" not in driver_conf("spark://10.1.2.3:7077")
    monkeypatch.setenv("LATTICE_SPARK_DRIVER_HOST", "10.1.2.9")
    assert driver_conf("spark://10.1.2.3:7077")["spark.driver.bindAddress"] == "10.1.2.9"


def test_feast_spark_offline_store_binds_the_embedded_driver_to_loopback(root, tmp_path):
    from feast.repo_config import RepoConfig

    from features.repo import store_config

    demo = load_config(root / "configs" / "demo.yaml")
    cfg = demo.model_copy(update={"feature_store": demo.feature_store.model_copy(update={"offline_store": "spark"})})
    conf = store_config(cfg, Paths(workdir=tmp_path / "wd", data_root=tmp_path))
    spark_conf = conf["offline_store"]["spark_conf"]
    assert spark_conf["spark.master"] == "local[2]"
    assert spark_conf["spark.driver.bindAddress"] == "127.0.0.1" and spark_conf["spark.driver.host"] == "127.0.0.1"
    assert spark_conf["spark.ui.showConsoleProgress"] == "false"
    assert RepoConfig(**conf).offline_store.spark_conf["spark.driver.bindAddress"] == "127.0.0.1"  # Feast takes it


def test_materialize_starts_feasts_driver_with_the_yaml_conf_relayed(monkeypatch):
    from types import SimpleNamespace

    import pipelines.jvm_log as jvm_log
    from pipelines.feast_jobs import _relay_feast_driver

    monkeypatch.setenv("SPARK_LOCAL_IP", "x")  # restored after the test
    monkeypatch.delenv("SPARK_LOCAL_IP")
    seen = []
    monkeypatch.setattr(jvm_log, "launch_relayed", lambda conf: seen.append(dict(conf.getAll())))
    spark_conf = {"spark.master": "local[2]", **driver_conf("local[2]")}
    _relay_feast_driver(SimpleNamespace(config=SimpleNamespace(offline_store=SimpleNamespace(type="spark",
                                                                                             spark_conf=spark_conf))))
    _relay_feast_driver(SimpleNamespace(config=SimpleNamespace(offline_store=SimpleNamespace(type="file"))))
    # every key of the yaml's conf reaches the driver's launch (a SparkConf made in a process whose
    # JVM already runs, as in a whole test session, also carries that JVM's spark.* properties)
    assert len(seen) == 1 and spark_conf.items() <= seen[0].items()
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"  # the JVM's own address lookup agrees
