"""Feast's own Spark session (the one materialization opens) binds loopback and leaves stderr to
errors: Airflow 3's task supervisor files every stderr line at ERROR. That a whole Spark task's
Airflow log has no ERROR line and no library chatter is checked on the real task log of the
standalone's features run (test_airflow_standalone)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

FEAST = r"""
import logging, os
logging.basicConfig(level=logging.INFO)
from feast.infra.offline_stores.contrib.spark_offline_store.spark import get_spark_session_or_start_new_with_repoconfig
from features.repo import write_repo
from features.store import get_store
from lattice.config import load_config
from lattice.paths import Paths
from pipelines.feast_jobs import _relay_feast_driver
cfg = load_config("configs/demo.yaml")
from pathlib import Path
paths = Paths(workdir=Path(os.environ["WORK"]), data_root=Path(os.environ["WORK"]))
write_repo(cfg, paths)
store = get_store(cfg, paths)
_relay_feast_driver(store)  # what materialize does before Feast opens its session
spark = get_spark_session_or_start_new_with_repoconfig(store.config.offline_store)
print("BIND", spark.conf.get("spark.driver.bindAddress"), spark.conf.get("spark.driver.host"),
      spark.sparkContext.getConf().get("spark.driver.host"), spark.range(5).count())
"""


def test_feasts_spark_session_binds_loopback_and_keeps_stderr_for_errors(tmp_path):
    script = tmp_path / "feast_task.py"
    script.write_text(FEAST)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WORK": str(tmp_path / "work")}
    env.pop("LATTICE_SPARK_DRIVER_HOST", None)
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "BIND 127.0.0.1 127.0.0.1 127.0.0.1 5" in proc.stdout
    # logging.basicConfig writes records to stderr here: only records may be there, no JVM line at all
    jvm = [x for x in proc.stderr.splitlines() if x.strip() and not x.startswith(("INFO:", "WARNING:", "DEBUG:"))]
    assert jvm == [] and "resolves to a loopback address" not in proc.stderr
