"""The whole chain on the scale-out services, from the same DAG code and configs as the embedded
demo: features (Spark standalone) -> teacher (two torchrun "nodes" on loopback) -> distill ->
promote (MLflow tracking server on PostgreSQL) -> serve (two uvicorn workers over Feast's Redis
online store). Each DAG runs its tasks, in order, through `run_task` in a fresh process (as an
Airflow worker would); this test process only checks what landed in each engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lattice.config import load_config
from tiny_dags import write_tiny_config

ROOT = Path(__file__).resolve().parents[2]
ROWS = 6000

pytestmark = [pytest.mark.slow, pytest.mark.scaleout]

# one DAG's tasks in order, in this process (its own Spark driver, on the profile's master)
DRIVER = """
import json, sys, time
from lattice.config import load_config
from lattice.orchestration.spec import dag_specs, defaults
from lattice.orchestration.task_runner import run_task
cfg, family, params, out = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
spec = next(s for s in dag_specs(load_config(cfg)) if s.family == family)
results = {}
for t in spec.tasks:
    t0 = time.perf_counter()
    results[t.task_id] = run_task(cfg, t, {**defaults(spec), **params}, spec.params)
    print(f"{family}.{t.task_id}: done in {time.perf_counter() - t0:.1f} s", flush=True)
open(out, "w").write(json.dumps(results, default=str))
"""


def _dag(cfg: Path, family: str, params: dict, tmp: Path) -> dict:
    out = tmp / f"{family}.json"
    env = dict(os.environ, LATTICE_SHUFFLE_PARTITIONS="2", LATTICE_SPARK_MEMORY="1g")
    for var in ("LATTICE_SPARK_MASTER", "LATTICE_PROFILE_FILE", "LATTICE_WORKDIR"):
        env.pop(var, None)  # the config's profile alone decides where everything runs
    driver = tmp / "run_dag.py"
    driver.write_text(DRIVER)
    r = subprocess.run([sys.executable, str(driver), str(cfg), family, json.dumps(params), str(out)], env=env,
                       cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0 and out.exists(), f"{family} DAG failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    print("\n".join(x for x in r.stdout.splitlines() if ": done in " in x))  # shown with -s or on a failure
    return json.loads(out.read_text())


def test_features_teacher_distill_promote_serve_on_the_scale_out_services(scaleout_spark, scaleout_mlflow, tmp_path):
    import redis

    from lattice.deploy import spark_cluster as sc
    from lattice.deploy.profile import read_profile
    from lattice.demo.serving_check import serving_check
    from lattice.orchestration.locations import paths_for
    from lattice.registry import CHAMPION, ModelRegistry

    layout = scaleout_mlflow
    svc = read_profile(layout.profile_file)
    cfg = write_tiny_config(
        ROOT / "configs" / "demo.yaml", tmp_path / "configs", data_root=tmp_path / "raw", workdir=tmp_path / "work",
        name="tinyso", overrides={
            "deployment": {"profile": "scale-out", "profile_file": str(layout.profile_file)},
            "feature_store": {"offline_store": "spark", "online_store": "sqlite"},  # the profile moves it to Redis
            # a first model on 6,000 rows: the gate's floors and calibration bounds for a model this
            # small (as test_distill's); a cell holds a handful of positives (search/conversion: 7)
            "promotion": {"floors": {"max_ne": 1.05, "min_auc": 0.5}, "calibration": [0.5, 2.0], "max_latency_ms": 200.0},
        })
    config = load_config(cfg)
    paths = paths_for(config)

    features = _dag(cfg, "features", {"synthetic_rows": ROWS}, tmp_path)
    assert features["consolidate"]["summary"]["totals"]["rows_out"] > ROWS * 0.9
    apps = sc._master_state(layout)
    assert any(a["name"] == "lattice-features" for a in apps["completedapps"] + apps["activeapps"]), apps
    # Feast: the registry lives in PostgreSQL, the online rows in Redis
    online = redis.Redis.from_url(svc.redis.url(db=0))
    assert online.dbsize() > 0
    import psycopg2

    with psycopg2.connect(svc.postgres.url("feast").replace("postgresql+psycopg2", "postgresql")) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM feature_views WHERE project_id = %s", (config.name,))
        assert cur.fetchone()[0] > 0
    assert not (paths.feast_repo / "data" / "online_store.db").exists()

    teacher = _dag(cfg, "train_teacher", {"epochs": 1, "nproc": 1}, tmp_path)
    trained = json.loads((paths.model_dir("teacher") / "summary.json").read_text())
    assert trained["world_size"] == 2, trained  # two loopback nodes, one rank each
    assert teacher["register_teacher"]["summary"]["model"] == "teacher"
    _dag(cfg, "distill", {"epochs": 1, "nproc": 1}, tmp_path)
    promote = _dag(cfg, "promote", {"dry_run": False}, tmp_path)
    decision = promote["promote_challenger"]["summary"]
    assert decision["passed"], decision

    reg = ModelRegistry(config, paths)
    assert reg.tracking_uri == svc.mlflow_tracking_uri and not (paths.mlflow / "mlflow.db").exists()
    assert reg.by_alias(CHAMPION).version == decision["champion_after"]
    assert list((layout.home / "mlflow-artifacts").rglob("model.pt"))  # in the server's artifact store

    served = serving_check(config, paths, n_requests=100)  # `lattice serve` with the profile's 2 workers
    assert served["failed"] == 0 and served["batch_status"] == 200, served
    assert served["matches_offline"], served  # Redis online features == the offline table's
