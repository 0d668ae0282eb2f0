"""What the DAGs of one platform config run, as plain data: five families per config, each a
chain of stage tasks, with the trigger parameters (JSON schema) the Airflow UI renders as a form.

Everything is derived from the config: the domains/objectives enums, default date range, epochs
and processes, the schedules and which synthetic step runs. A new config file, domain or
objective therefore changes the DAGs with no code change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from lattice.config import PlatformConfig
from lattice.config.schema import HASHING_NEEDS_FIT, Schedule

Family = Literal["features", "train_teacher", "distill", "promote", "tune"]
FAMILIES: tuple[Family, ...] = ("features", "train_teacher", "distill", "promote", "tune")
AssetKind = Literal["features", "teacher", "student"]


@dataclass(frozen=True)
class ParamSpec:
    """One trigger parameter: its default, help text and JSON schema (validated at trigger time)."""

    name: str
    default: Any
    title: str
    description: str
    schema: dict[str, Any]


@dataclass(frozen=True)
class TaskSpec:
    task_id: str
    stage: str
    doc: str
    forward: dict[str, str] = field(default_factory=dict)
    """Run parameter -> stage keyword. A value changed from its default must be honoured: a stage
    without that keyword fails the task instead of silently ignoring the user's choice."""
    fixed: dict[str, Any] = field(default_factory=dict)
    """Keywords always passed (e.g. model="teacher")."""
    config_sets: dict[str, str] = field(default_factory=dict)
    """Run parameter -> config key it sets for this run (like `--set KEY=VALUE`), e.g. the FP8
    switch of the trigger form -> `fp8.enabled`; a parameter left empty keeps the config's value."""
    switch: tuple[str, str] | None = None
    """(boolean run parameter, stage): run that stage instead when the parameter is true."""
    outlet: AssetKind | None = None
    """The asset this task updates when it succeeds (triggers asset-scheduled DAGs)."""
    narrow: bool = False
    """Apply the run's `domains` / `objectives` params by narrowing the config and, for a domain
    subset, the training table the stage reads (model stages)."""
    gate: str | None = None
    """Summary key that must be true for the task to succeed (the promotion gate's `passed`): when
    it is false the task fails without retries, its message listing the failed checks, so the run
    is red in the grid and no downstream task acts as if the gate had passed."""
    replaces_model: str | None = None
    """The model folder this task rewrites (`paths.model_dir(name)`): the stage writes it in a
    scratch folder that replaces the old one only when the stage succeeds, so a failed run leaves
    the previous model whole instead of a mix of new metadata beside the old weights."""


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


def _domains(config: PlatformConfig) -> ParamSpec:
    return _subset("domains", config.domain_names, "Domains",
                   "Domains (surfaces) to include; all by default. Values come from the config's 'domains'.")


def _objectives(config: PlatformConfig) -> ParamSpec:
    return _subset("objectives", config.objective_names, "Objectives",
                   "Objectives (model heads) to include; all by default. Values come from the config's 'objectives'.")


def _training(config: PlatformConfig, what: str) -> list[ParamSpec]:
    return [
        _int("epochs", config.training.epochs, "Epochs", f"Passes over the training set for the {what}.", 1, 100),
        _int("nproc", config.training.nproc, "Training processes",
             "torchrun processes (ranks) sharing the embedding tables; 1 trains without sharding; "
             "0 chooses from the machine (one per GPU, else 1).", 0, 64),
        ParamSpec("fp8", None, "FP8",
                  f"Train the {what} with FP8 GEMMs at the sites the probe finds safe (fp8.enabled); "
                  "empty keeps the config's setting.", {"type": ["null", "boolean"]}),
    ]


FP8_SET = {"fp8": "fp8.enabled"}


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


def _features_tasks(config: PlatformConfig) -> list[TaskSpec]:
    tasks = []
    if config.synthetic is not None:
        tasks.append(TaskSpec("synthesize_raw_logs", "synth", "Generate the synthetic raw logs unless they already exist.",
                              forward={"synthetic_rows": "rows"}))
    every = {"start": "start", "end": "end", "domains": "domains", "spark_master": "master"}
    tasks += [
        TaskSpec("consolidate", "consolidate",
                 "Ingest every domain's raw log, validate it (bad rows to quarantine) and write the consolidated examples.",
                 forward=every),
        TaskSpec("aggregates", "aggregates", "Point-in-time entity aggregates over the consolidated examples.", forward=every),
        TaskSpec("feast_apply", "feast_apply", "Register entities, feature views and the feature service in Feast.",
                 forward=every),
        TaskSpec("training_set", "training_set",
                 "Point-in-time join of examples and Feast features into the training set.", forward=every),
    ]
    if any(f.hashing in HASHING_NEEDS_FIT for f in config.features.sparse):
        # on the table training reads, and before `materialize` announces the features asset
        # (which starts teacher training, and training refuses a missing or stale fit)
        tasks.append(TaskSpec("fit_hashing", "hashing_fit",
                              "Fit the id -> row maps of the vocab / mixed / learned sparse features on the training split.",
                              forward={"spark_master": "master"}))
    tasks += [
        TaskSpec("materialize", "materialize", "Load the latest feature values into the online store.",
                 forward=every, outlet="features"),
    ]
    return tasks


def _doc(config: PlatformConfig, family: Family, tasks: list[TaskSpec], schedule: Schedule) -> str:
    if schedule.cron:
        when = f"cron `{schedule.cron}`"
    else:
        when = f"updates of the `{schedule.asset}` asset" if schedule.asset else "manual triggers only"
    lines = [f"### {config.name} · {family}", "", config.description, "", f"Runs on {when} (config `schedules.{family}`).", ""]
    lines += [f"1. `{t.task_id}` (stage `{t.stage}`): {t.doc}" for t in tasks]
    lines += ["", f"Domains: {', '.join(config.domain_names)}. Objectives: {', '.join(config.objective_names)}."]
    return "\n".join(lines)


def _model_task(*args, **kwargs) -> TaskSpec:
    return TaskSpec(*args, narrow=True, **kwargs)


def _tree_tasks(config: PlatformConfig) -> list[TaskSpec]:
    """The LightGBM baselines after the teacher is registered (a failed baseline never holds back the
    teacher or the DAGs its asset triggers), then one report with the teacher beside them."""
    b = config.models.baselines
    trees = [n for n, on in (("gbdt", b.gbdt), ("gbdt_cell", b.gbdt_cell)) if on]
    if not trees:
        return []
    what = {"gbdt": "one booster per objective over every domain", "gbdt_cell": "one booster per (domain, objective) cell"}
    tasks = [_model_task(f"train_{n}", "train_gbdt",
                         f"LightGBM baseline `{n}` ({what[n]}) on the teacher's split and features.",
                         fixed={"model": n}, replaces_model=n) for n in trees]
    tasks.append(_model_task("evaluate_vs_trees", "evaluate",
                             "The teacher beside the tree baselines: per-cell NE and whether the teacher beats trees.",
                             fixed={"model": ["teacher", *trees]}))
    return tasks


def dag_specs(config: PlatformConfig) -> list[DagSpec]:
    """The DAGs of one config, in the order data flows through them (then the manual `tune`)."""
    families: dict[Family, tuple[str, list[ParamSpec], list[TaskSpec]]] = {
        "features": ("Consolidate, validate and publish the features of every domain",
                     _features_params(config), _features_tasks(config)),
        "train_teacher": (
            "Train the multi-domain multi-objective teacher and register it",
            [_domains(config), _objectives(config), *_training(config, "teacher")],
            [
                _model_task("train_teacher", "train", "Sharded teacher training under torchrun on the training set.",
                         forward={"epochs": "epochs", "nproc": "nproc"}, fixed={"model": "teacher"},
                         replaces_model="teacher", config_sets=FP8_SET),
                _model_task("evaluate_teacher", "evaluate", "NE, AUC and calibration per (domain, objective) cell.",
                         fixed={"model": "teacher"}),
                _model_task("register_teacher", "register", "Version the teacher in the model registry.",
                         fixed={"model": "teacher"}, outlet="teacher"),
                *_tree_tasks(config),
            ],
        ),
        "distill": (
            "Distill the teacher into the small student and register it as challenger",
            [_domains(config), _objectives(config), *_training(config, "student")],
            [
                _model_task("distill_student", "distill",
                         "Teacher soft labels, student training on labels + soft labels, evaluation and cost report.",
                         forward={"epochs": "epochs", "nproc": "nproc"}, fixed={"export": False, "register": False},
                         replaces_model="student", config_sets=FP8_SET),
                _model_task("export_student", "export",
                            "Export the student for serving (TorchScript) and measure latency and size.",
                         fixed={"model": "student"}),
                _model_task("register_student", "register", "Version the student in the registry as challenger.",
                         fixed={"model": "student"}, outlet="student"),
            ],
        ),
        "promote": (
            "Gate the challenger against the champion and move the champion alias (or roll back)",
            [
                _flag("dry_run", False, "Dry run", "Run the gate and report its decision without moving the champion alias."),
                _flag("rollback", False, "Roll back",
                      "Instead of promoting, point the champion alias back at the previous champion."),
            ],
            [
                TaskSpec("gate_and_promote", "promote",
                         "Compare the challenger with the champion cell by cell and promote it; a rejected "
                         "challenger fails this task (no retries) with every failed check in its message, and "
                         "the decision stays in its `decision` XCom.",
                         forward={"dry_run": "dry_run"}, switch=("rollback", "rollback"), gate="passed"),
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
            [
                TaskSpec("tune", "tune",
                         "Optuna trials over `tune.space`, each judged by its validation macro NE (the test split is "
                         "never read), every trial an MLflow run; the best goes to <workdir>/tune/<study>/overlay.yaml.",
                         forward={"model": "model", "trials": "trials", "epochs": "epochs", "nproc": "nproc",
                                  "study": "study"}),
            ],
        ),
    }
    out = []
    for family in FAMILIES:
        description, params, tasks = families[family]
        schedule = getattr(config.schedules, family)
        out.append(DagSpec(dag_id(config.name, family), family, config.name, f"{config.name}: {description}",
                           _doc(config, family, tasks, schedule), schedule, params, tasks))
    return out


def defaults(spec: DagSpec) -> dict[str, Any]:
    return {p.name: p.default for p in spec.params}
