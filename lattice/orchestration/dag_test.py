"""Run a DAG in-process with `dag.test()` as the scheduler or a backfill would: a *scheduled* run
on its logical date's data interval. `dag.test()` alone makes manual runs, which keep their form's
dates; the benches and tests that prove the DAGs move with time need the scheduled kind."""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import Iterator


@contextlib.contextmanager
def scheduled_runs() -> Iterator[None]:
    """While open, `dag.test(logical_date=...)` creates a scheduled run (replacing an earlier run
    of the same DAG and logical date) with the data interval `dag.test()` inferred."""
    from airflow.models import dagrun
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType
    from sqlalchemy import select

    def as_scheduled(*, dag, run_id, logical_date, data_interval, run_after, conf, triggered_by,
                     triggering_user_name, start_date, session):
        old = session.scalar(select(dagrun.DagRun).where(dagrun.DagRun.dag_id == dag.dag_id,
                                                         dagrun.DagRun.logical_date == logical_date))
        if old is not None:
            session.delete(old)
            session.commit()
        return dag.create_dagrun(
            run_id=dagrun.DagRun.generate_run_id(run_type=DagRunType.SCHEDULED, logical_date=logical_date,
                                                 run_after=run_after),
            logical_date=logical_date, data_interval=data_interval, run_after=run_after, conf=conf,
            run_type=DagRunType.SCHEDULED, state=DagRunState.RUNNING, triggered_by=triggered_by,
            triggering_user_name=triggering_user_name, start_date=start_date, session=session)

    real = dagrun.get_or_create_dagrun
    dagrun.get_or_create_dagrun = as_scheduled
    try:
        yield
    finally:
        dagrun.get_or_create_dagrun = real


def run_scheduled(dag, logical_date: dt.datetime):
    """One scheduled run of `dag` at `logical_date` (UTC midnight: its data interval is the day before)."""
    with scheduled_runs():
        return dag.test(logical_date=logical_date)


def xcom(dr, task_id: str, key: str = "return_value"):
    """A task's XCom of a finished run (None when it pushed none)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(XComModel.get_many(run_id=dr.run_id, dag_ids=dr.dag_id, task_ids=task_id, key=key)).first()
        return XComModel.deserialize_value(row) if row is not None else None
