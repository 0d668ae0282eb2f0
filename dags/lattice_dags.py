"""Lattice DAG factory: one family of DAGs per platform config in `configs/` (or $LATTICE_CONFIGS_DIR):
`<config>__features`, `<config>__train_teacher`, `<config>__distill`, `<config>__promote`, `<config>__tune`.

This file only wires: what each DAG runs and which parameters it takes come from
`lattice.orchestration.spec`, and every task calls its stage(s) through `lattice.stages` in
`lattice.orchestration.task_runner`: one step a task, except that consecutive Spark steps (the
features chain from consolidate to materialize) run in one task sharing one Spark session. Heavy libraries (torch, Spark, Feast) are imported inside
tasks only, so this file parses in well under a second.

An invalid config is skipped here (this file never fails, so the other configs' DAGs stay up) and
reported by `dags/lattice_config_errors.py` as an Airflow import error. A deterministic error
(invalid params or config, data failing validation) fails its task without retries; anything else
is retried with back-off. A rejected promotion is no failure: the `gate` task succeeds with the
decision and `promote_challenger` after it is skipped, so a red task is always a crash.
"""

from __future__ import annotations

import datetime as dt
import logging
import os

from airflow.sdk import Asset, Param, dag, get_current_context, task

from lattice.config import PlatformConfig
from lattice.orchestration.config_errors import load_configs
from lattice.orchestration.spec import AirflowTask, DagSpec, dag_specs, asset_name, form_values, rule_started

log = logging.getLogger(__name__)

# Retries with exponential back-off; tests set LATTICE_AIRFLOW_RETRIES=0 to fail fast.
RETRIES = int(os.environ.get("LATTICE_AIRFLOW_RETRIES", "2"))
DEFAULT_ARGS = {
    "owner": "lattice",
    "retries": RETRIES,
    "retry_delay": dt.timedelta(seconds=30),
    "retry_exponential_backoff": True,
    "max_retry_delay": dt.timedelta(minutes=10),
}
START = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def assets_for(config: PlatformConfig) -> dict[str, Asset]:
    """features / teacher / student: what the upstream DAG publishes and the downstream one waits for.
    Named by config, not by folder: a moved workdir must not turn into a new (or a clashing) asset."""
    return {kind: Asset(name=asset_name(config, kind), uri=f"x-lattice://{config.name}/{kind}", group="lattice")
            for kind in ("features", "teacher", "student", "retrain")}


def _task(config_file: str, config: PlatformConfig, spec: DagSpec, group: AirflowTask, outlets: list[Asset]):
    @task(task_id=group.task_id, outlets=outlets, doc_md=group.doc)
    def run_stage() -> dict:
        from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

        from lattice.orchestration.task_runner import (DeterministicError, GateRejected, NotYet, OutsideRange,
                                                       run_steps, run_task)
        from lattice.quiet import library_notices

        library_notices()  # before the stage imports GE, torch, fbgemm: their chatter never reaches the log
        context = get_current_context()
        run = context.get("dag_run")
        run_type = getattr(getattr(run, "run_type", None), "value", getattr(run, "run_type", None))
        interval = (str(run_type) if run_type else None, context.get("data_interval_start"), context.get("data_interval_end"))
        params = form_values(dict(context["params"]), spec.params)
        # a retrain a monitoring rule started trains on part of the day it tripped on
        params = rule_started(config, spec.family, params, [a.name for a in context.get("triggering_asset_events") or {}])
        t = group.last
        try:
            if len(group.steps) == 1:
                result = run_task(config_file, t, params, spec.params, interval)
            else:
                results = run_steps(config_file, group.steps, params, spec.params, interval)
                for step_id, step_result in results.items():  # each step's result, as its own task's was
                    context["ti"].xcom_push(key=step_id, value=step_result)
                result = results[t.task_id]
        except (OutsideRange, NotYet) as exc:  # nothing to do for this run: skipped, with the reason
            raise AirflowSkipException(str(exc)) from exc
        except GateRejected as exc:
            if t.acts_on_gate:  # nothing to carry out: skipped (not failed), the failed checks in the log
                raise AirflowSkipException(str(exc)) from exc
            # the gate decided: a rejection is its result (XCom), and the task that acts on it is skipped
            log.warning("%s", exc)
            context["ti"].xcom_push(key="decision", value=exc.result)
            result = exc.result
        except DeterministicError as exc:
            raise AirflowFailException(str(exc)) from exc  # failed now: a retry would fail the same way
        if t.outlet and result.get("variant"):
            # a domain/objective subset's model is its own variant: the DAGs downstream of this
            # asset (distill, promote) keep working on the full models, so nothing is announced
            context["ti"].xcom_push(key="return_value", value=result)
            raise AirflowSkipException(f"{t.task_id}: a subset run (variant {result['variant']!r}); its model is kept "
                                       f"under its own name and the {t.outlet} asset is not updated")
        if t.emit_if and t.outlet:
            found = (result.get("summary") or {}).get(t.emit_if)
            if not found:  # nothing to announce: skipped, so the outlet asset gets no event
                context["ti"].xcom_push(key="return_value", value=result)
                raise AirflowSkipException(f"{t.task_id}: no {t.emit_if} in this run; the {t.outlet} asset is not updated")
            # the event says why: downstream runs (and the Asset page) show the rules, cells and figures
            context["outlet_events"][outlets[0]].extra = {t.emit_if: found}
        return result

    out = run_stage()
    from lattice.orchestration.airflow_links import links_for_stages

    # buttons on the task's page that open this run's MLflow run, gate decision, report, metrics
    links = links_for_stages([group.last.stage])
    if links:
        out.operator.operator_extra_links = links
    return out


def _timetable(cron: str):
    """A cron schedule whose runs carry the interval that just ended as their data interval: the
    03:00 run of Jan 6 under '0 3 * * *' (or `@daily`'s midnight run) works on [Jan 5, Jan 6).
    Airflow 3's default for a cron string is a trigger timetable whose data interval is the instant
    of the run, which would point a daily run at a day that has not happened yet."""
    from airflow.sdk.definitions.timetables.interval import CronDataIntervalTimetable

    return CronDataIntervalTimetable(cron, timezone="UTC")


def build(config_file: str, config: PlatformConfig, spec: DagSpec, assets: dict[str, Asset]):
    if spec.schedule.cron:
        schedule = _timetable(spec.schedule.cron)
    elif spec.schedule.asset:
        schedule = [assets[spec.schedule.asset]]
        if spec.family == "train_teacher" and config.monitoring.rules:
            schedule = assets[spec.schedule.asset] | assets["retrain"]  # a tripped monitoring rule retrains too
        if spec.family == "promote" and config.training.window and spec.schedule.asset != "features":
            # a windowed challenger is judged on the day after its window: when it is registered that
            # day has not arrived (the gate task is skipped, "waits"), and the features run that
            # brings the day starts the gate again
            schedule = assets[spec.schedule.asset] | assets["features"]
    else:
        schedule = None

    @dag(
        dag_id=spec.dag_id,
        description=spec.description,
        doc_md=spec.doc_md,
        schedule=schedule,
        start_date=START,
        catchup=False,
        max_active_runs=1,  # runs of one DAG share a workdir; never two at once
        tags=spec.tags,
        default_args=DEFAULT_ARGS,
        params={p.name: Param(p.default, description=p.description, title=p.title, **p.schema) for p in spec.params},
    )
    def family():
        previous = None
        for group in spec.airflow_tasks:  # consecutive Spark steps share one task (one Spark session)
            outlet = group.last.outlet
            current = _task(config_file, config, spec, group, [assets[outlet]] if outlet else [])
            if previous is not None:
                previous >> current
            previous = current

    return family()


def placeholder(exc) -> object:
    """A DAG in the list for a config that fails to load, so the problem is where the user looks
    (the list, not only the import-error banner): its description and docs carry every problem and
    the fix, and its one task fails with the same text if someone triggers it."""
    from pathlib import Path

    stem = Path(exc.file).stem.replace("-", "_")
    text = str(exc)
    first = text.strip().splitlines()[0] if text.strip() else "invalid config"

    @dag(dag_id=f"{stem}__invalid_config", description=f"INVALID CONFIG {exc.file}: {first}"[:200],
         doc_md=f"### The platform config `{exc.file}` does not load\n\nIts DAGs are not generated until it is fixed."
                f"\n\n```\n{text}\n```", schedule=None, start_date=START, catchup=False,
         tags=["lattice", "invalid-config"], default_args={"owner": "lattice", "retries": 0})
    def invalid():
        @task(task_id="fix_the_config")
        def fail() -> None:
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(f"{exc.file} is invalid; fix it (its DAGs come back on the next parse):\n{text}")

        fail()

    return invalid()


def build_all() -> dict[str, object]:
    dags: dict[str, object] = {}
    loaded = load_configs()
    for exc in loaded.errors:
        # the full report is also an import error (dags/lattice_config_errors.py); Airflow marks
        # every DAG of a file with an import error stale, so this file never raises itself. A
        # warning, not an error: every task process parses this file again, and an ERROR line
        # about another config would sit in the log of every task that succeeds
        log.warning("invalid platform config %s (its DAGs are not loaded)\n%s", exc.file, exc)
        built = placeholder(exc)
        dags[built.dag_id] = built
    for path, config in loaded.configs:
        assets = assets_for(config)
        for spec in dag_specs(config):
            dags[spec.dag_id] = build(str(path), config, spec, assets)
    return dags


globals().update(build_all())
