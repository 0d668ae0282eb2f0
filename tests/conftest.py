"""Shared fixtures. Heavy services (Spark, Feast, Airflow) get one instance per test run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("LATTICE_SHARED_DATA", ROOT.parent / "shared" / "data"))
ARTIFACTS = ROOT / "test-artifacts"

# The fast tier is `pytest -m "not slow"`. A test is slow when it lives in a tier that starts real
# services (every integration and end-to-end test starts Spark, torchrun, Airflow, uvicorn or a
# browser) or when it asks, even through another fixture, for a fixture that starts one: a new
# test gets the mark from where it is and what it uses, not from remembering a decorator.
SLOW_DIRS = ("integration", "e2e")
SLOW_FIXTURES = {"spark", "scaleout_services", "scaleout_spark", "scaleout_mlflow"}


def pytest_collection_modifyitems(config, items) -> None:
    tests = ROOT / "tests"
    for item in items:
        path = Path(str(item.path)).resolve()
        tier = path.relative_to(tests).parts[0] if path.is_relative_to(tests) else ""
        if tier in SLOW_DIRS or SLOW_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared sample data not found at {SHARED_DATA}; set LATTICE_SHARED_DATA")
    return SHARED_DATA


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def spark():
    """ONE real SparkSession for the whole pytest run (local[2], UI off, few shuffle partitions,
    driver on 127.0.0.1), shared by every test that needs Spark."""
    from pipelines.spark import get_spark

    os.environ.setdefault("LATTICE_SPARK_MEMORY", "2g")
    session = get_spark("local[2]", app_name="lattice-tests", shuffle_partitions=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def tiny_demo(tmp_path_factory):
    """Factory of tiny synthetic demo tables: `tiny_demo(name, rows, **table_options)` generates the
    demo config's logs at `rows` rows (the tiny model sizes, batches of 256), writes the local
    training table and returns (config, paths)."""
    from lattice.config import load_config
    from lattice.data.local_table import write_local_table
    from lattice.data.synth import generate
    from lattice.paths import Paths
    from lattice.training.tiny import tiny

    def make(name: str, rows: int, **table_options):
        base = tmp_path_factory.mktemp(name)
        cfg = tiny(load_config(ROOT / "configs" / "demo.yaml"), data_root=str(base / "raw"), batch_size=256)
        generate(cfg, rows, base / "raw", progress=False)
        paths = Paths.for_config(cfg, base / "work")
        write_local_table(cfg, paths, **table_options)
        return cfg, paths

    return make


@pytest.fixture(scope="session")
def scaleout_services():
    """PostgreSQL and Redis of the scale-out profile on free loopback ports, in throwaway folders
    (data and logs in one, credentials and the profile file in another, owner-only), stopped at
    the end of the run. Returns the `Layout`; `layout.profile_file` is the profile to point
    `deployment.profile_file` (or LATTICE_PROFILE_FILE) at."""
    from lattice.deploy import local_services as ls
    from lattice.deploy.profile import write_profile

    layout = ls.throwaway_layout()
    try:
        ls.start_postgres(layout)
        ls.start_redis(layout)
        write_profile(layout.profile_file, ls.profile_dict(layout))
        yield layout
    finally:
        ls.stop_redis(layout)
        ls.stop_postgres(layout)


@pytest.fixture(scope="session")
def scaleout_spark(scaleout_services):
    """A Spark standalone cluster (a master and two 1-core workers from pyspark's own distribution)
    on the free loopback ports of `scaleout_services`, stopped at the end of the run. Returns the
    same `Layout`; its profile's `spark.master` names this master. A test that kills a worker
    starts it again (`spark_cluster.start_worker`)."""
    from lattice.deploy import spark_cluster

    try:
        spark_cluster.start_spark(scaleout_services)
        yield scaleout_services
    finally:
        spark_cluster.stop_spark(scaleout_services)


@pytest.fixture(scope="session")
def scaleout_mlflow(scaleout_services):
    """An MLflow tracking server on the PostgreSQL of `scaleout_services` (database lattice_mlflow),
    artifacts under its home, stopped at the end of the run. Returns the `Layout`; the profile's
    `mlflow.tracking_uri` names this server."""
    from lattice.deploy import mlflow_server

    try:
        mlflow_server.start_mlflow(scaleout_services)
        yield scaleout_services
    finally:
        mlflow_server.stop_mlflow(scaleout_services)
