"""What the DAGs of one platform config run, as plain data: five families per config, each a
chain of stage tasks, with the trigger parameters (JSON schema) the Airflow UI renders as a form.

Everything is derived from the config: the domains/objectives enums, default date range, epochs
and processes, the schedules and which synthetic step runs. A new config file, domain or
objective therefore changes the DAGs with no code change.
"""

from __future__ import annotations

import datetime as dt
import sys
from dataclasses import dataclass, replace
from typing import Any

from lattice.config import PlatformConfig
from lattice.config.schema import Schedule
from lattice.orchestration.graph import FAMILIES, AssetKind, Family, TaskSpec, steps_of

__all__ = ["FAMILIES", "AssetKind", "AirflowTask", "DagSpec", "Family", "ParamSpec", "TaskSpec", "dag_id", "dag_specs",
           "defaults"]

# Stages that open the platform's Spark session (or Feast's Spark offline store). Consecutive steps
# of these run as one Airflow task: each task is a fresh process, and a Spark start there costs
# ~19 s (bench/bench_spark_start.py), so five Spark tasks spent more time starting JVMs than
# working on a small day; in one process every step reuses the session the first one started.
SPARK_STAGES = frozenset({"consolidate", "aggregates", "feast_apply", "training_set", "hashing_fit", "materialize"})


@dataclass(frozen=True)
class AirflowTask:
    """One task of a DAG: one step of the pipeline graph, or several consecutive Spark steps run in
    order in one process (one Spark session). Only the last step may announce an asset, pass a
    gate or emit on a condition, so a group succeeds or fails as its last step would."""

    steps: tuple[TaskSpec, ...]

    @property
    def task_id(self) -> str:
        if len(self.steps) == 1:
            return self.steps[0].task_id
        return f"{self.steps[0].task_id}_to_{self.steps[-1].task_id}"

    @property
    def last(self) -> TaskSpec:
        return self.steps[-1]

    @property
    def doc(self) -> str:
        if len(self.steps) == 1:
            return self.steps[0].doc
        lines = [f"{len(self.steps)} steps in one process sharing one Spark session (each step's start, "
                 "summary and time are stage lines in this task's log; a retry reruns them all, each "
                 "replacing its own output):"]
        lines += [f"{i}. `{s.task_id}` (stage `{s.stage}`): {s.doc}" for i, s in enumerate(self.steps, 1)]
        return "\n".join(lines)


def airflow_tasks(steps: list[TaskSpec]) -> list[AirflowTask]:
    """The DAG's tasks: each run of consecutive Spark steps is one task, every other step its own."""
    out: list[list[TaskSpec]] = []
    for step in steps:
        spark = step.stage in SPARK_STAGES
        if spark and out and out[-1][-1].stage in SPARK_STAGES and out[-1][-1].family == step.family:
            out[-1].append(step)
        else:
            out.append([step])
    for group in out:
        early = [s.task_id for s in group[:-1] if s.outlet or s.gate or s.emit_if]
        if early:  # an asset announced mid-group would start downstream DAGs before the group's end
            raise ValueError(f"steps {early} announce an asset or pass a gate but are not last in their task")
    return [AirflowTask(tuple(g)) for g in out]

@dataclass(frozen=True)
class ParamSpec:
    """One trigger parameter: its default, help text and JSON schema (validated at trigger time)."""

    name: str
    default: Any
    title: str
    description: str
    schema: dict[str, Any]


@dataclass(frozen=True)
class DagSpec:
    dag_id: str
    family: Family
    config_name: str
    description: str
    doc_md: str
    schedule: Schedule
    params: list[ParamSpec]
    tasks: list[TaskSpec]
    """The graph's steps of this family, in order."""

    @property
    def airflow_tasks(self) -> list[AirflowTask]:
        """What the DAG runs: the steps grouped into tasks, each starting when the previous one succeeded."""
        return airflow_tasks(self.tasks)

    @property
    def tags(self) -> list[str]:
        return ["lattice", self.config_name, self.family]


def dag_id(config_name: str, family: Family) -> str:
    return f"{config_name}__{family}"


# ---------------------------------------------------------------- parameters


def _date(name: str, default: str, title: str, description: str) -> ParamSpec:
    return ParamSpec(name, default, title, description, {"type": "string", "format": "date"})


def _subset(name: str, values: list[str], title: str, description: str) -> ParamSpec:
    schema = {"type": "array", "items": {"type": "string", "enum": values}, "minItems": 1, "uniqueItems": True,
              "examples": values}
    return ParamSpec(name, list(values), title, description, schema)


def _int(name: str, default: int, title: str, description: str, minimum: int, maximum: int) -> ParamSpec:
    return ParamSpec(name, default, title, description, {"type": "integer", "minimum": minimum, "maximum": maximum})


def _flag(name: str, default: bool, title: str, description: str) -> ParamSpec:
    return ParamSpec(name, default, title, description, {"type": "boolean"})


# A parameter that either sets a boolean config key or keeps the config's value: a drop-down of
# three choices, the config's own value named on the first. The values are strings because
# Airflow 3.3's form draws any "boolean" type as an on/off switch (no third state), and its
# drop-down shows a chosen value only for strings, numbers and null; `form_values` turns them back
# into True / False / None before the task runner sees them.
CHOICE = {None: None, "true": True, "false": False}


def _config_choice(name: str, title: str, description: str, current: bool) -> ParamSpec:
    shown = "on" if current else "off"
    schema = {"type": ["null", "string"], "enum": list(CHOICE),
              "values_display": {"null": f"config default ({shown})", "true": "on", "false": "off"}}
    return ParamSpec(name, None, title, f"{description} The first choice keeps the config's setting (now {shown}).",
                     schema)


def is_choice(spec: ParamSpec) -> bool:
    return spec.schema.get("enum") == list(CHOICE)


def form_values(params: dict[str, Any], specs: list[ParamSpec]) -> dict[str, Any]:
    """The run's parameters with each three-way choice as True / False / None (a caller that
    passes the boolean itself keeps it)."""
    choices = {p.name for p in specs if is_choice(p)}
    return {k: CHOICE.get(v, v) if k in choices and isinstance(v, str) else v for k, v in params.items()}


def _domains(config: PlatformConfig) -> ParamSpec:
    return _subset("domains", config.domain_names, "Domains",
                   "Domains (surfaces) to include; all by default. Values come from the config's 'domains'.")


def _objectives(config: PlatformConfig) -> ParamSpec:
    return _subset("objectives", config.objective_names, "Objectives",
                   "Objectives (model heads) to include; all by default. Values come from the config's 'objectives'.")


def _training(config: PlatformConfig, what: str) -> list[ParamSpec]:
    window = config.training.window
    return [
        ParamSpec("end", None, "Window end",
                  f"With training.window ({window or 'unset in this config'}): the interval end (exclusive, YYYY-MM-DD) "
                  f"the {what}'s window ends at; its test day is this date. Empty: the day after the table's newest day.",
                  {"type": ["null", "string"], "format": "date"}),
        _int("epochs", config.training.epochs, "Epochs", f"Passes over the training set for the {what}.", 1, 100),
        _int("nproc", config.training.nproc, "Training processes",
             "torchrun processes (ranks) sharing the embedding tables; 1 trains without sharding; "
             "0 chooses from the machine (one per GPU, else 1).", 0, 64),
        _config_choice("fp8", "FP8", f"Train the {what} with FP8 GEMMs at the sites the probe finds safe "
                       "(fp8.enabled).", config.fp8.enabled),
    ]


def _warm_start(config: PlatformConfig, parent: str) -> ParamSpec:
    return ParamSpec("warm_start", None, "Warm start",
                     f"Continue from {parent}; empty keeps the config's training.warm_start "
                     f"({config.training.warm_start}).",
                     {"type": ["null", "string"], "enum": [None, "none", "last", "champion"]})


def _validation_share(config: PlatformConfig) -> ParamSpec:
    return ParamSpec("validation_share", None, "Held-out share of the newest day",
                     "With training.window: the share of the window's newest day held out for validation (the rest "
                     f"trains). Empty: training.window_validation ({config.training.window_validation}), or "
                     f"monitoring.retrain_validation_share ({config.monitoring.retrain_validation_share}) when a "
                     "monitoring rule started the run.",
                     {"type": ["null", "number"], "exclusiveMinimum": 0, "maximum": 1})


def asset_name(config: PlatformConfig, kind: AssetKind) -> str:
    """The name of a config's asset (dags/lattice_dags.assets_for): by config, not by folder."""
    return f"lattice.{config.name}.{kind}"


def rule_started(config: PlatformConfig, family: Family, params: dict[str, Any], triggered_by: list[str]) -> dict[str, Any]:
    """A teacher run that the retrain asset started (a monitoring rule tripped) holds out
    `monitoring.retrain_validation_share` of its window's newest day, the day the rule tripped on,
    unless its form set a share: the retrain then trains on what changed. `triggered_by`: the
    names of the assets whose events started the run."""
    if family != "train_teacher" or params.get("validation_share") is not None:
        return params
    if asset_name(config, "retrain") not in triggered_by:
        return params
    return {**params, "validation_share": config.monitoring.retrain_validation_share}


def _features_params(config: PlatformConfig) -> list[ParamSpec]:
    tr = config.time_range
    params = [
        _date("start", tr.start.isoformat(), "Start date", "First event date to consolidate (inclusive, YYYY-MM-DD)."),
        _date("end", tr.end.isoformat(), "End date",
              "Last event date to consolidate (exclusive, YYYY-MM-DD); after the start date."),
        _domains(config),
        ParamSpec("spark_master", None, "Spark master",
                  "Spark master URL (e.g. local[2], spark://host:7077); empty uses the pipeline's default.",
                  {"type": ["null", "string"]}),
    ]
    if config.synthetic is not None:
        # the default is the config's: scheduled and asset-triggered runs use the defaults, so a
        # value that lived only in the form would regenerate the logs at every scheduled run
        params.append(_int("synthetic_rows", config.synthetic.rows, "Synthetic rows",
                           "Rows of synthetic raw logs (configs with a 'synthetic' section; default: its "
                           "'rows'); the logs are regenerated only when they hold a different count.",
                           100, 1_000_000_000))
    return params


# on the form's first field of a DAG with a cron schedule: the form itself says what an unpause adds
UNPAUSE_NOTE = ("Note: unpausing this DAG (the 'Unpause on trigger' box below) also starts one scheduled run now, for the "
                "latest complete `{cron}` interval (UTC) with the default values, besides this run (one runs at a time).")


def unpause_interval(cron: str) -> tuple[dt.date, dt.date] | None:
    """The data interval of the scheduled run an unpause would create now: Airflow's own timetable
    with catch-up off, asked at the time the DAG file is parsed (so the form's dates stay current).
    None where Airflow is not loaded yet: the demo, the CLI and a task's steps read the specs too,
    and importing Airflow there would replace the process's logging handlers with its own (a
    task's stage lines vanished from its log that way). The DAG file has imported it already."""
    if "airflow" not in sys.modules:
        return None
    try:
        from airflow.timetables.base import TimeRestriction
        from airflow.timetables.interval import CronDataIntervalTimetable
    except ImportError:
        return None
    info = CronDataIntervalTimetable(cron, "UTC").next_dagrun_info(
        last_automated_data_interval=None, restriction=TimeRestriction(earliest=None, latest=None, catchup=False))
    return (info.data_interval.start.date(), info.data_interval.end.date()) if info is not None else None


def unpause_note(config: PlatformConfig, cron: str) -> str:
    note = UNPAUSE_NOTE.format(cron=cron)
    found = unpause_interval(cron)
    if found is None:
        return note
    start, end = found
    inside = start < config.time_range.end and end > config.time_range.start
    return (f"{note} Today that is [{start}, {end})"
            + ("." if inside else f", outside the config's time_range [{config.time_range.start}, "
               f"{config.time_range.end}): that run is skipped, it processes nothing."))


def scheduling(schedule: Schedule) -> str:
    """What Airflow runs for this schedule besides manual triggers: when, on which dates, what an
    unpause starts, catch-up and backfill (the DAG's docs and the trigger form say it)."""
    if schedule.cron:
        return (f"**Schedule**: cron `{schedule.cron}` (UTC). A scheduled run works on the interval that just ended "
                "(under `@daily`, the run at Jan 6 00:00 processes [Jan 5, Jan 6)), clipped to the config's "
                "`time_range` (a day outside it is skipped), with this form's defaults. **Unpausing starts a run**: "
                "when this DAG is unpaused, by its toggle or by the trigger form's *Unpause on trigger* box (ticked "
                "by default on a paused DAG), Airflow 3 at once creates one scheduled run for the latest complete "
                "interval (the dates the DAG page shows as its next run), besides the run you trigger, which waits "
                "for it (one run at a time). **No catch-up** (`catchup=False`): intervals missed while paused or "
                "while the scheduler was down are not run. **Backfill**: `airflow backfill create --dag-id <id> "
                "--from-date A --to-date B` runs every interval in [A, B) as its own run on its own dates.")
    if schedule.asset:
        return (f"**Schedule**: a run starts when the `{schedule.asset}` asset is updated (updates that arrive "
                "during a run start one more run after it). Unpausing starts no run by itself: updates made while "
                "the DAG was paused are not queued. No catch-up and no backfill (a backfill needs a time schedule); "
                "trigger it by hand to rerun.")
    return "**Schedule**: manual triggers only; unpausing starts no run, and there is nothing to catch up or backfill."


def _doc(config: PlatformConfig, family: Family, tasks: list[TaskSpec], schedule: Schedule) -> str:
    if schedule.cron:
        when = f"cron `{schedule.cron}`"
    else:
        when = f"updates of the `{schedule.asset}` asset" if schedule.asset else "manual triggers only"
    lines = [f"### {config.name} · {family}", "", config.description, "", f"Runs on {when} (config `schedules.{family}`).", ""]
    for task in airflow_tasks(tasks):
        if len(task.steps) == 1:
            t = task.steps[0]
            lines.append(f"1. `{t.task_id}` (stage `{t.stage}`): {t.doc}")
        else:
            lines.append(f"1. `{task.task_id}`: the steps below in one process, one Spark session:")
            lines += [f"    1. `{t.task_id}` (stage `{t.stage}`): {t.doc}" for t in task.steps]
    lines += ["", f"Domains: {', '.join(config.domain_names)}. Objectives: {', '.join(config.objective_names)}."]
    lines += ["", scheduling(schedule)]
    return "\n".join(lines)


def dag_specs(config: PlatformConfig) -> list[DagSpec]:
    """The DAGs of one config, in the order data flows through them (then the manual `tune`)."""
    families: dict[Family, tuple[str, list[ParamSpec]]] = {
        "features": ("Consolidate, validate and publish the features of every domain", _features_params(config)),
        "train_teacher": ("Train the multi-domain multi-objective teacher and register it",
                          [_domains(config), _objectives(config), *_training(config, "teacher"),
                           _warm_start(config, "the last teacher or the latest registered one"),
                           _validation_share(config)]),
        "distill": ("Distill the teacher into the small student and register it as challenger",
                    [_domains(config), _objectives(config), *_training(config, "student"),
                     _warm_start(config, "the last student or the champion")]),
        "promote": (
            "Gate the challenger against the champion and move the champion alias (or roll back)",
            [
                _flag("dry_run", False, "Dry run", "Run the gate and report its decision without moving the champion alias."),
                _flag("rollback", False, "Roll back",
                      "Instead of promoting, point the champion alias back at the previous champion."),
            ],
        ),
        "monitor": (
            "Watch the served model per cell (online NE, calibration, drift) and start retraining when a rule trips",
            [
                _date("end", config.time_range.end.isoformat(), "End date",
                      "Last day to judge (exclusive, YYYY-MM-DD); a scheduled run uses its own data interval."),
                _int("lookback_days", 7, "Lookback days", "Days before the end date the rules see (several periods).", 1, 365),
                ParamSpec("period", "day", "Period", "The monitor's period.", {"type": "string", "enum": ["hour", "day"]}),
            ],
        ),
        "tune": (
            "Hyperparameter search on the validation split (Optuna, resumable); writes the best as a config overlay",
            [
                ParamSpec("model", "teacher", "Model", "The model to tune.", {"type": "string", "enum": ["teacher"]}),
                _int("trials", config.tune.trials, "Trials",
                     "Trials of the study in total; a rerun of the same study runs only the missing ones.", 1, 10_000),
                _int("epochs", config.tune.epochs, "Epochs per trial", "Training epochs of every trial.", 1, 100),
                _int("nproc", config.training.nproc, "Training processes",
                     "torchrun ranks of every trial (0: chosen from the machine).", 0, 64),
                ParamSpec("study", None, "Study", "Study name (default: the model); a new name starts a new study.",
                          {"type": ["null", "string"]}),
            ],
        ),
    }
    out = []
    for family in FAMILIES:
        description, params = families[family]
        tasks = steps_of(config, family)
        schedule = getattr(config.schedules, family)
        if schedule.cron and params:
            params = [replace(params[0], description=f"{params[0].description} {unpause_note(config, schedule.cron)}"),
                      *params[1:]]
        out.append(DagSpec(dag_id(config.name, family), family, config.name, f"{config.name}: {description}",
                           _doc(config, family, tasks, schedule), schedule, params, tasks))
    return out


def defaults(spec: DagSpec) -> dict[str, Any]:
    return {p.name: p.default for p in spec.params}
