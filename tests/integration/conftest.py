"""Integration fixtures: ONE real SparkSession for the whole pytest run (local[2], UI off, few
shuffle partitions), shared by every integration test that needs Spark."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def spark():
    from pipelines.spark import get_spark

    os.environ.setdefault("LATTICE_SPARK_MEMORY", "2g")
    session = get_spark("local[2]", app_name="lattice-tests", shuffle_partitions=2)
    yield session
    session.stop()
