"""Feast's "experimental feature" notice of its Spark offline store / SparkSource is dropped where
the platform calls that API (features.store.feast_experimental), and nothing else is."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# a fresh process with Python's default warning handling: what `lattice demo` prints on stderr
CHILD = r"""
import sys
from pathlib import Path
from lattice.config import load_config
from lattice.paths import Paths
from features.repo import _source
config = load_config("configs/demo.yaml")
if sys.argv[1] == "bare":
    from feast.infra.offline_stores.contrib.spark_offline_store.spark_source import SparkSource
    SparkSource(name="x_source", path="/tmp/x", file_format="parquet", timestamp_field="event_timestamp")
else:
    _source(config, Paths(Path(sys.argv[2]), Path(sys.argv[2])), config.features.aggregates[0].name)
"""


def _stderr(mode: str, tmp_path: Path) -> str:
    import os

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("IS_TEST", None)  # Feast's own switch that silences the notice
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(tmp_path)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stderr


@pytest.mark.slow  # two fresh processes that import Feast (~10 s each)
def test_platform_spark_source_prints_no_warning_line(tmp_path):
    bare = _stderr("bare", tmp_path)
    # the control: Feast's call alone prints the notice and its source line (what the demo showed)
    assert "experimental feature" in bare and "warnings.warn(" in bare, bare
    ours = _stderr("platform", tmp_path)
    assert "warnings.warn(" not in ours and "experimental" not in ours, ours


def test_other_warnings_still_show_inside_the_filter():
    from features.store import feast_experimental

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with feast_experimental():
            warnings.warn("The spark offline store is an experimental feature in alpha development.", RuntimeWarning)
            warnings.warn("something else about the spark offline store", RuntimeWarning)
    assert [str(w.message) for w in seen] == ["something else about the spark offline store"]
