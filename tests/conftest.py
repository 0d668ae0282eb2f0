"""Shared fixtures. Heavy services (Spark, Feast, Airflow) get one instance per test run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("LATTICE_SHARED_DATA", ROOT.parent / "shared" / "data"))
ARTIFACTS = ROOT / "test-artifacts"


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
