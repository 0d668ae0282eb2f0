"""Integration fixtures. The one real SparkSession of a pytest run (`spark`: local[2], UI off,
few shuffle partitions) lives in tests/conftest.py, shared with the unit tests that need Spark."""
