"""What the DAGs of one platform config run, as plain data: five families per config, each a
chain of stage tasks, with the trigger parameters (JSON schema) the Airflow UI renders as a form.

Everything is derived from the config: the domains/objectives enums, default date range, epochs
and processes, the schedules and which synthetic step runs. A new config file, domain or
objective therefore changes the DAGs with no code change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lattice.config import PlatformConfig
from lattice.config.schema import Schedule
from lattice.orchestration.graph import FAMILIES, AssetKind, Family, TaskSpec, steps_of

__all__ = ["FAMILIES", "AssetKind", "DagSpec", "Family", "ParamSpec", "TaskSpec", "dag_id", "dag_specs", "defaults"]

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
    """Run in order; each task starts when the previous one succeeded."""

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


def _doc(config: PlatformConfig, family: Family, tasks: list[TaskSpec], schedule: Schedule) -> str:
    if schedule.cron:
        when = f"cron `{schedule.cron}`"
    else:
        when = f"updates of the `{schedule.asset}` asset" if schedule.asset else "manual triggers only"
    lines = [f"### {config.name} · {family}", "", config.description, "", f"Runs on {when} (config `schedules.{family}`).", ""]
    lines += [f"1. `{t.task_id}` (stage `{t.stage}`): {t.doc}" for t in tasks]
    lines += ["", f"Domains: {', '.join(config.domain_names)}. Objectives: {', '.join(config.objective_names)}."]
    return "\n".join(lines)


def dag_specs(config: PlatformConfig) -> list[DagSpec]:
    """The DAGs of one config, in the order data flows through them (then the manual `tune`)."""
    families: dict[Family, tuple[str, list[ParamSpec]]] = {
        "features": ("Consolidate, validate and publish the features of every domain", _features_params(config)),
        "train_teacher": ("Train the multi-domain multi-objective teacher and register it",
                          [_domains(config), _objectives(config), *_training(config, "teacher"),
                           ParamSpec("warm_start", None, "Warm start",
                                     f"Continue from the last teacher or the champion; empty keeps the config's "
                                     f"training.warm_start ({config.training.warm_start}).",
                                     {"type": ["null", "string"], "enum": [None, "none", "last", "champion"]})]),
        "distill": ("Distill the teacher into the small student and register it as challenger",
                    [_domains(config), _objectives(config), *_training(config, "student")]),
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
        out.append(DagSpec(dag_id(config.name, family), family, config.name, f"{config.name}: {description}",
                           _doc(config, family, tasks, schedule), schedule, params, tasks))
    return out


def defaults(spec: DagSpec) -> dict[str, Any]:
    return {p.name: p.default for p in spec.params}
