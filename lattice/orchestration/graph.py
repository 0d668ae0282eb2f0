"""The platform's pipeline, declared once: every step, its order, the stage it calls, what it reads
and writes, and the DAG family that runs it.

Three callers read this graph and nothing else: the DAG factory (`spec.dag_specs` groups the steps
by family, one DAG each), the demo (`lattice demo` runs every step in order, then checks serving)
and `lattice run CONFIG [--from STEP] [--to STEP]`. All three run a step through one executor
(`task_runner.execute`), so scratch-and-swap of model folders, domain subsets and the data interval
behave the same for a DAG task, a demo stage and a CLI run.

Steps are derived from the config: a `synthetic` section adds the synthetic-log step, a sparse
feature with a fitted hashing scheme adds the hashing fit, enabled baselines add their training
steps. A new domain or objective changes no step (the stages read the config).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from lattice.config import PlatformConfig
from lattice.config.schema import HASHING_NEEDS_FIT

Family = Literal["features", "train_teacher", "distill", "promote", "monitor", "tune"]
FAMILIES: tuple[Family, ...] = ("features", "train_teacher", "distill", "promote", "monitor", "tune")
# the families a full run goes through, in data order (`tune` is a manual search, never part of a run)
RUN_FAMILIES: tuple[Family, ...] = ("features", "train_teacher", "distill", "promote")
AssetKind = Literal["features", "teacher", "student", "retrain"]

# run parameter -> keyword of the stages that read events over a data interval
INTERVAL = {"start": "start", "end": "end"}


@dataclass(frozen=True)
class TaskSpec:
    """One step of the pipeline: a task of its family's DAG, a stage of the demo, a step of `lattice run`."""

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
    choice of the trigger form -> `fp8.enabled`; a parameter left empty keeps the config's value."""
    switch: tuple[str, str] | None = None
    """(boolean run parameter, stage): run that stage instead when the parameter is true."""
    outlet: AssetKind | None = None
    """The asset this task updates when it succeeds (triggers asset-scheduled DAGs)."""
    narrow: bool = False
    """Apply the run's `domains` / `objectives` params by narrowing the config and, for a domain
    subset, the training table the stage reads (model stages)."""
    gate: str | None = None
    """Summary key that says whether the run goes on (the promotion gate's `passed`): when it is
    false the executor raises `GateRejected` with every failed check. `lattice run` stops there
    (exit 3), the demo reports the decision, and a DAG task succeeds (it decided) unless
    `acts_on_gate`."""
    acts_on_gate: bool = False
    """The step carries out a gate's decision (`promote_challenger` after `gate`): a rejection skips its DAG
    task (pink, the reasons in its log) instead of failing it, so a red task is always a crash."""
    emit_if: str | None = None
    """Summary key that must be non-empty for the task's `outlet` asset to be emitted (the
    monitor's `tripped` rules): otherwise the task ends skipped, and no asset event is sent."""
    replaces_model: str | None = None
    """The model folder this task rewrites (`paths.model_dir(name)`): the stage writes it in a
    scratch folder that replaces the old one only when the stage succeeds, so a failed run leaves
    the previous model whole instead of a mix of new metadata beside the old weights."""
    family: Family = "features"
    """The DAG that runs this step."""
    reads: tuple[str, ...] = ()
    """Artifacts the step needs (names of `Paths` folders or `model:<name>`, `registry:<name>`)."""
    writes: tuple[str, ...] = ()
    """Artifacts the step produces; a later step that reads one of them runs after it."""


def _model_task(*args, **kwargs) -> TaskSpec:
    return TaskSpec(*args, narrow=True, **kwargs)


FP8_SET = {"fp8": "fp8.enabled"}
TRAINING = {"epochs": "epochs", "nproc": "nproc", "end": "end"}


def _features(config: PlatformConfig) -> list[TaskSpec]:
    every = {**INTERVAL, "domains": "domains", "spark_master": "master"}
    # downstream of consolidate a run works on its days for every domain: an aggregate counts an
    # entity's events in all domains, and the training set and online store serve every model
    # (a domain subset there rewrote them with that subset's rows only)
    days = {**INTERVAL, "spark_master": "master"}
    steps = []
    if config.synthetic is not None:
        steps.append(TaskSpec("synthesize_raw_logs", "synth", "Generate the synthetic raw logs unless they already exist.",
                              forward={"synthetic_rows": "rows"}, writes=("raw",)))
    steps += [
        TaskSpec("consolidate", "consolidate",
                 "Ingest every domain's raw log, validate it (bad rows to quarantine) and write the consolidated examples.",
                 forward=every, reads=("raw",), writes=("consolidated", "quarantine", "validation")),
        TaskSpec("aggregates", "aggregates", "Point-in-time entity aggregates over the consolidated examples.",
                 forward=days, reads=("consolidated",), writes=("aggregates",)),
        TaskSpec("feast_apply", "feast_apply", "Register the entities and feature views in Feast (each registered model version gets its own FeatureService at registration).",
                 forward=days, reads=("aggregates",), writes=("feast_repo",)),
        TaskSpec("training_set", "training_set",
                 "Point-in-time join of examples and Feast features into the training set.", forward=days,
                 reads=("consolidated", "feast_repo"), writes=("training_set",)),
    ]
    steps.append(TaskSpec("materialize", "materialize", "Load the latest feature values into the online store.",
                          forward=days, outlet="features", reads=("feast_repo",), writes=("online_store",)))
    return [_in(s, "features") for s in steps]


def neural_baselines(config: PlatformConfig) -> list[str]:
    b = config.models.baselines
    names = [n for n, on in (("separate", b.separate), ("pooled", b.pooled)) if on]
    return names + ([b.multitask] if b.multitask != "none" else [])


def tree_baselines(config: PlatformConfig) -> list[str]:
    b = config.models.baselines
    return [n for n, on in (("gbdt", b.gbdt), ("gbdt_cell", b.gbdt_cell)) if on]


def _baselines(config: PlatformConfig) -> list[TaskSpec]:
    """The baselines after the teacher is registered (a failed baseline never holds back the teacher
    or the DAGs its asset triggers): the neural ones on one process, then the LightGBM ones and one
    report with the teacher beside the trees."""
    # `end`, `validation_share`: a windowed run's baselines train and are tested on the teacher's days
    steps = [_model_task(f"train_{n}", "train", f"Baseline `{n}` on the teacher's split and features (1 process).",
                         forward={"epochs": "epochs", "end": "end", "validation_share": "validation_share"},
                         fixed={"model": n, "nproc": 1}, replaces_model=n,
                         reads=("training_set",), writes=(f"model:{n}",))
             for n in neural_baselines(config)]
    trees = tree_baselines(config)
    what = {"gbdt": "one booster per objective over every domain", "gbdt_cell": "one booster per (domain, objective) cell"}
    steps += [_model_task(f"train_{n}", "train_gbdt", f"LightGBM baseline `{n}` ({what[n]}) on the teacher's split and features.",
                          forward={"end": "end"}, fixed={"model": n}, replaces_model=n, reads=("training_set",),
                          writes=(f"model:{n}",))
              for n in trees]
    if trees:
        steps.append(_model_task("evaluate_vs_trees", "evaluate",
                                 "The teacher beside the tree baselines: per-cell NE and whether the teacher beats trees.",
                                 fixed={"model": ["teacher", *trees]}, reads=("model:teacher", *(f"model:{n}" for n in trees))))
    return steps


def _train_teacher(config: PlatformConfig) -> list[TaskSpec]:
    # the trees whose leaf ids the teacher / student read (models.leaves), fitted right before the
    # teacher on its own days (`end`, training.window): a forest fitted with the feature days
    # could have seen the labels of the window's validation and test rows
    trees = [TaskSpec("fit_trees", "trees_fit",
                      "Fit the LightGBM boosters whose leaf ids feed the teacher / student (models.leaves) on the "
                      "teacher's train split (a windowed run's train days), validation only to stop early.",
                      forward={"end": "end", "validation_share": "validation_share"},
                      reads=("training_set",), writes=("trees",))] if config.models.leaves.models else []
    # the id maps of vocab / mixed / learned features, likewise on the teacher's days (a fit on the
    # stored split counted the ids, and for `learned` the labels, of the window's test day)
    hashing = [TaskSpec("fit_hashing", "hashing_fit",
                        "Fit the id -> row maps of the vocab / mixed / learned sparse features on the teacher's train "
                        "split (a windowed run's train days).",
                        forward={"end": "end", "validation_share": "validation_share"},
                        reads=("training_set",), writes=("hashing",))] \
        if any(f.hashing in HASHING_NEEDS_FIT for f in config.features.sparse) else []
    steps = [
        *hashing,
        *trees,
        _model_task("train_teacher", "train", "Sharded teacher training under torchrun on the training set.",
                    forward={**TRAINING, "warm_start": "warm_start", "validation_share": "validation_share"},
                    fixed={"model": "teacher"}, replaces_model="teacher",
                    config_sets=FP8_SET,
                    reads=("training_set", "hashing", "trees"), writes=("model:teacher",)),
        _model_task("evaluate_teacher", "evaluate", "NE, AUC and calibration per (domain, objective) cell.",
                    fixed={"model": "teacher"}, reads=("model:teacher",)),
        _model_task("register_teacher", "register", "Version the teacher in the model registry.",
                    fixed={"model": "teacher"}, outlet="teacher", reads=("model:teacher",), writes=("registry:teacher",)),
        *_baselines(config),
    ]
    return [_in(s, "train_teacher") for s in steps]


def _distill() -> list[TaskSpec]:
    steps = [
        _model_task("distill_student", "distill",
                    "Teacher soft labels, student training on labels + soft labels, evaluation and cost report.",
                    forward={**TRAINING, "warm_start": "warm_start"}, fixed={"export": False, "register": False},
                    replaces_model="student",
                    config_sets=FP8_SET, reads=("model:teacher", "training_set"), writes=("model:student",)),
        _model_task("export_student", "export",
                    "Export the student for serving (TorchScript) and measure latency and size.",
                    fixed={"model": "student"}, reads=("model:student",), writes=("artifact:student",)),
        _model_task("register_student", "register", "Version the student in the registry as challenger.",
                    fixed={"model": "student"}, outlet="student", reads=("artifact:student",),
                    writes=("registry:student",)),
    ]
    return [_in(s, "distill") for s in steps]


def _promote() -> list[TaskSpec]:
    # the decision and its move are two steps, so a rejection is an outcome (the gate succeeds, the
    # promote_challenger step is skipped) and never looks like a crash (a failure of either)
    return [TaskSpec("gate", "gate",
                     "Compare the challenger with the champion cell by cell and record the decision on the challenger; "
                     "the champion alias never moves here. Rejecting is a decision: the task succeeds, the decision "
                     "(every reason, the per-cell figures) is its XCom, and `promote_challenger` after it is skipped.",
                     forward={"dry_run": "dry_run", "rollback": "rollback"}, gate="passed",
                     family="promote", reads=("registry:student",), writes=("registry:decision",)),
            TaskSpec("promote_challenger", "apply_gate",
                     "Carry out the gate's decision: a pass moves the champion alias (the decision record, alias and "
                     "history in one step); skipped, with the failed checks in its log, when the gate rejected.",
                     forward={"dry_run": "dry_run"}, switch=("rollback", "rollback"), gate="passed", acts_on_gate=True,
                     family="promote", reads=("registry:decision",), writes=("registry:champion",)),
            TaskSpec("refresh_report", "report",
                     "Rewrite the work dir's report.html for the registry's current champion and the decision that "
                     "promoted it (a DAG chain's results where a person looks).",
                     family="promote", reads=("registry:champion",), writes=("report",))]


def _monitor() -> list[TaskSpec]:
    return [TaskSpec("monitor", "monitor",
                     "Join the prediction log with the labels that arrived; per-cell online NE, AUC and calibration, "
                     "feature drift, the config's monitoring.rules. A tripped rule emits the retrain asset (the teacher "
                     "DAG's trigger when the config has rules), with the rule, the cell and the figures.",
                     forward={"end": "end", "lookback_days": "lookback_days", "period": "period"},
                     family="monitor", outlet="retrain", emit_if="tripped",
                     reads=("prediction_log", "consolidated"), writes=("monitoring",))]


def _tune() -> list[TaskSpec]:
    return [TaskSpec("tune", "tune",
                     "Optuna trials over `tune.space`, each judged by its validation macro NE (the test split is never "
                     "read), every trial an MLflow run; the best goes to <workdir>/tune/<study>/overlay.yaml.",
                     forward={"model": "model", "trials": "trials", "epochs": "epochs", "nproc": "nproc", "study": "study"},
                     family="tune", reads=("training_set",), writes=("tune",))]


def _in(step: TaskSpec, family: Family) -> TaskSpec:
    from dataclasses import replace

    return replace(step, family=family)


def pipeline(config: PlatformConfig) -> list[TaskSpec]:
    """Every step of the config's pipeline in run order (the manual `tune` last)."""
    steps = [*_features(config), *_train_teacher(config), *_distill(), *_promote(), *_monitor(), *_tune()]
    check_order(steps)
    return steps


def steps_of(config: PlatformConfig, family: Family) -> list[TaskSpec]:
    return [s for s in pipeline(config) if s.family == family]


def check_order(steps: list[TaskSpec]) -> None:
    """Every artifact a step reads is written by an earlier step or by none (an input from outside,
    such as a source's raw files): a declaration that reads ahead of its writer is a bug here."""
    ids = [s.task_id for s in steps]
    if len(set(ids)) != len(ids):
        raise ValueError(f"pipeline step ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
    writer = {a: i for i, s in enumerate(steps) for a in s.writes}
    for i, s in enumerate(steps):
        late = [a for a in s.reads if writer.get(a, -1) > i]
        if late:
            raise ValueError(f"step {s.task_id!r} reads {late} before the step that writes them")


def select(steps: list[TaskSpec], start: str | None = None, stop: str | None = None,
           families: tuple[Family, ...] = RUN_FAMILIES) -> list[TaskSpec]:
    """The steps of `families` from step (or family) `start` to `stop`, both included. A name that
    is a family and a step (`train_teacher`) starts at the family's first step (`fit_hashing` or
    `fit_trees`, which prepare the teacher's days) and stops at the step."""
    run = [s for s in steps if s.family in families]
    names = [s.task_id for s in run]

    def index(name: str, first: bool) -> int:
        fam = [i for i, s in enumerate(run) if s.family == name]
        if fam and (first or name not in names):
            return fam[0] if first else fam[-1]
        if name in names:
            return names.index(name)
        raise KeyError(f"no step or family {name!r} in this pipeline; steps: {', '.join(names)}; "
                       f"families: {', '.join(families)}")

    lo = index(start, True) if start else 0
    hi = index(stop, False) if stop else len(run) - 1
    if hi < lo:
        raise KeyError(f"--to {stop!r} comes before --from {start!r} in the pipeline")
    return run[lo:hi + 1]
