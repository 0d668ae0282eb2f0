"""A Spark task that succeeds leaves no ERROR line in its log. The task runs in a child process
captured as Airflow 3's task supervisor captures one: `logging` records with their levels, and
every line on stderr filed at ERROR (so stderr itself must stay empty)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

TASK = r"""
import logging, os, sys
h = logging.StreamHandler(open(os.environ["RECORDS"], "w", buffering=1))
h.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
logging.getLogger().addHandler(h)
logging.getLogger().setLevel(logging.INFO)  # what an Airflow task passes
from lattice.quiet import library_notices
library_notices()  # as dags/lattice_dags.py does first in every task
from lattice.config import load_config
from lattice.orchestration.spec import dag_specs
from lattice.orchestration.task_runner import RunContext, execute
from lattice.paths import Paths
from lattice.training.tiny import tiny
cfg = tiny(load_config("configs/demo.yaml"), data_root=os.environ["RAW"])
spec = next(d for d in dag_specs(cfg) if d.family == "features")
task = next(t for t in spec.tasks if t.stage == "consolidate")
execute(RunContext(cfg, Paths.for_config(cfg, os.environ["WORK"]), {}), task, spec.params)
"""


def test_consolidate_task_log_has_no_error_line_and_no_library_chatter(tmp_path):
    from lattice.config import load_config
    from lattice.data.synth import generate
    from lattice.training.tiny import tiny

    raw = tmp_path / "raw"
    generate(tiny(load_config(ROOT / "configs" / "demo.yaml"), data_root=str(raw)), 1500, raw, progress=False)
    script, records = tmp_path / "task.py", tmp_path / "records.log"
    script.write_text(TASK)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAW": str(raw), "WORK": str(tmp_path / "work"),
           "RECORDS": str(records), "LATTICE_SPARK_MEMORY": "1g"}
    env.pop("LATTICE_SPARK_MASTER", None)
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = records.read_text().splitlines()
    assert [x for x in proc.stderr.splitlines() if x.strip()] == []  # each would be an ERROR line in Airflow
    assert [x for x in log if x.startswith(("ERROR", "CRITICAL"))] == []
    assert "\r" not in proc.stdout  # no console progress bar
    noise = ("Skipping registering function", "NativeCodeLoader", "Setting default log level", "Successfully loaded")
    assert [x for x in log if any(n in x for n in noise)] == []
    # the story ends with the summary, and it is there
    assert any("stage consolidate finished" in x for x in log), log[-10:]


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
