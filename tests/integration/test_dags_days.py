"""Scheduled runs of the features DAG on three logical dates, in order, through `dag.test()`: each
run works on its own data interval's day (never the config's whole time range), and the tables then
hold exactly those days. That a re-run of a day rewrites that day's files alone is checked on the
stage the DAG task calls (test_pipeline_demo), without a fourth Spark run here."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from lattice.orchestration.airflow_env import apply_local_airflow_env, process_test_home
from tiny_dags import write_tiny_config

ROOT = Path(__file__).resolve().parents[2]
apply_local_airflow_env(process_test_home())  # before Airflow is imported anywhere in this process

SPARK_TASK = "consolidate_to_materialize"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def airflow_db():
    from airflow.utils import db

    db.initdb()


def _xcom(dr, task_id: str, key: str) -> dict:
    from lattice.orchestration.dag_test import xcom

    value = xcom(dr, task_id, key)
    assert value is not None, f"no {key!r} result from {dr.dag_id}.{task_id}"
    return value


def _days(table: Path) -> list[str]:
    """The date partitions of a table that hold files."""
    return sorted({part.split("=", 1)[1] for f in table.rglob("*.parquet") for part in f.relative_to(table).parts
                   if part.startswith("date=")})


def test_three_scheduled_days_in_order_each_on_its_own_day(airflow_db, monkeypatch, tmp_path: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    configs = tmp_path / "configs"
    write_tiny_config(ROOT / "configs" / "demo.yaml", configs, data_root=tmp_path / "raw", workdir=tmp_path / "work",
                      name="tiny")
    monkeypatch.setenv("LATTICE_CONFIGS_DIR", str(configs))
    monkeypatch.setenv("LATTICE_AIRFLOW_RETRIES", "0")
    dag = DagBag(dag_folder=str(ROOT / "dags")).dags["tiny__features"]

    def run(logical: dt.datetime):
        from lattice.orchestration.dag_test import run_scheduled

        dr = run_scheduled(dag, logical)
        assert str(dr.state) == "success", f"run of {logical}: {dr.state}"
        assert str(dr.run_type.value if hasattr(dr.run_type, "value") else dr.run_type) == "scheduled"
        return dr

    utc = dt.timezone.utc
    logicals = [dt.datetime(2026, 1, d, tzinfo=utc) for d in (6, 7, 8)]
    processed = []
    for logical in logicals:
        dr = run(logical)
        day = dr.data_interval_start.date().isoformat()
        assert dr.data_interval_end.date() - dr.data_interval_start.date() == dt.timedelta(days=1)
        cons = _xcom(dr, SPARK_TASK, "consolidate")["summary"]
        assert cons["partitions"] == [day], (logical, cons["partitions"])
        t = cons["totals"]
        assert t["rows_in"] == t["rows_out"] + t["quarantined"] + t["skipped"] and t["rows_out"] > 0
        processed.append(day)
    # the midnight runs of Jan 6, 7 and 8 work on Jan 5, 6 and 7, one after the other
    assert processed == ["2026-01-05", "2026-01-06", "2026-01-07"]
    work = tmp_path / "work"
    assert _days(work / "consolidated") == processed and _days(work / "training_set") == processed
