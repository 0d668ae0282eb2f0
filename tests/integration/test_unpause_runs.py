"""What a trigger from the form on a paused DAG starts, by Airflow's own code: the UI's two calls
(unpause, then trigger, as the form's default "Unpause on trigger" box does) and one pass of the
scheduler's DagRun creation. An asset-scheduled DAG gets exactly the run asked for; a cron DAG gets
it plus the one scheduled run its form and docs announce, on the dates they name."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from lattice.orchestration.airflow_env import apply_local_airflow_env, process_test_home
from tiny_dags import write_tiny_config

ROOT = Path(__file__).resolve().parents[2]
apply_local_airflow_env(process_test_home())  # before Airflow is imported anywhere in this process

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def synced(tmp_path_factory):
    """The DAGs of a tiny config written to the metadata DB as the DAG processor does (new DAGs
    start paused)."""
    import os

    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.utils import db

    db.initdb()
    tmp = tmp_path_factory.mktemp("unpause")
    folder = tmp / "configs"
    write_tiny_config(ROOT / "configs" / "demo.yaml", folder, data_root=tmp / "raw", workdir=tmp / "work", name="unpause")
    old = os.environ.get("LATTICE_CONFIGS_DIR")
    os.environ["LATTICE_CONFIGS_DIR"] = str(folder)
    try:
        bag = DagBag(dag_folder=str(ROOT / "dags"))
        assert bag.import_errors == {}
        DagBundlesManager().sync_bundles_to_db()
        sync_bag_to_db(bag, "dags-folder", None)
    finally:
        if old is None:
            os.environ.pop("LATTICE_CONFIGS_DIR", None)
        else:
            os.environ["LATTICE_CONFIGS_DIR"] = old
    return bag.dags


def _trigger_from_form(dag_id: str, conf: dict) -> list:
    """Unpause, trigger, then one scheduler pass; returns the DAG's runs."""
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.sqlalchemy import prohibit_commit
    from airflow.utils.types import DagRunTriggeredByType
    from sqlalchemy import select

    with create_session() as session:
        model = session.get(DagModel, dag_id)
        assert model.is_paused, f"{dag_id} should start paused"
        model.is_paused = False  # the form's "Unpause on trigger" (PATCH /dags/{id})
    with create_session() as session:
        trigger_dag(dag_id, triggered_by=DagRunTriggeredByType.UI, conf=conf, session=session)
    runner = SchedulerJobRunner(job=Job())
    with create_session() as session:
        with prohibit_commit(session) as guard:
            runner._create_dagruns_for_dags(guard, session)
            guard.commit()
    with create_session() as session:
        runs = list(session.scalars(select(DagRun).where(DagRun.dag_id == dag_id)))
        session.expunge_all()
    return runs


def test_asset_scheduled_dag_trigger_on_paused_dag_creates_exactly_one_run(synced) -> None:
    runs = _trigger_from_form("unpause__train_teacher", {"epochs": 1})
    assert [(str(r.run_type), r.conf) for r in runs] == [("manual", {"epochs": 1})]


def test_cron_dag_trigger_on_paused_dag_creates_the_runs_its_form_names(synced) -> None:
    from lattice.orchestration.spec import UNPAUSE_NOTE

    dag = synced["unpause__features"]
    # what the form and the docs say before the click
    assert UNPAUSE_NOTE.format(cron="@daily") in dag.params.get_param("start").description
    assert "Unpausing starts a run" in dag.doc_md and "No catch-up" in dag.doc_md

    before = dt.datetime.now(dt.timezone.utc)
    runs = _trigger_from_form("unpause__features", {"synthetic_rows": 3000})
    by_type = {str(r.run_type): r for r in runs}
    assert sorted(by_type) == ["manual", "scheduled"] and len(runs) == 2, [(r.run_type, r.run_id) for r in runs]
    assert by_type["manual"].conf == {"synthetic_rows": 3000}
    # the one scheduled run: the latest complete @daily interval (yesterday, UTC), default params
    today = dt.datetime.combine(before.date(), dt.time(), tzinfo=dt.timezone.utc)
    scheduled = by_type["scheduled"]
    assert (scheduled.data_interval_start, scheduled.data_interval_end) == (today - dt.timedelta(days=1), today)
    assert not scheduled.conf
    # and the form named those very dates (and that they lie outside the config's time_range)
    named = f"Today that is [{scheduled.data_interval_start.date()}, {scheduled.data_interval_end.date()}), outside"
    assert named in dag.params.get_param("start").description
