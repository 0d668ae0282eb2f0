"""How one Airflow task runs one platform stage: reload the config, check the run parameters,
pick the stage keywords, call it through `lattice.stages`, log its counts, return a JSON summary.

Stages write only where `Paths` says and replace their outputs, so a retried or re-run task
redoes its work instead of appending to it (idempotent).

Errors come in two kinds. `DeterministicError` (bad params, an invalid config, a subset the config
cannot take, data that fails validation, a source that cannot be read as declared, a rejected
promotion) fails the same way on every try: the DAG file turns it into a failure without retries.
Any other `TaskError` (a crashed trainer, a busy service) is retried with back-off.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lattice.orchestration.run_paths import RunPaths, relocate, subset_table, subset_variant
from lattice.orchestration.spec import ParamSpec, TaskSpec
from lattice.paths import Paths

log = logging.getLogger("lattice.orchestration")


class TaskError(RuntimeError):
    """A task that cannot run as asked; the message says what is wrong and what to do."""


class DeterministicError(TaskError):
    """Retrying cannot help: the same config, params and data fail the same way. Fix, then re-run."""


class GateRejected(DeterministicError):
    """The stage ran and said no (the promotion gate rejected the challenger): `result` holds the
    summary the task would have returned (the decision and every reason). An outcome, not a crash:
    the gate's DAG task succeeds with it, the step that acts on it is skipped, `lattice run` exits 3."""

    def __init__(self, message: str, result: dict[str, Any]):
        super().__init__(message)
        self.result = result


# Exceptions (by module.qualname, so nothing is imported to check) that a retry would only repeat.
DETERMINISTIC = frozenset({
    "lattice.config.loader.ConfigError",
    "lattice.orchestration.narrow.SubsetError",
    "pipelines.validate.ValidationFailed",
    "lattice.data.source_files.SourceError",
})


def is_deterministic(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it was raised from, is one a retry would only repeat."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DeterministicError) or any(
                f"{c.__module__}.{c.__qualname__}" in DETERMINISTIC for c in type(current).__mro__):
            return True
        current = current.__cause__ or current.__context__
    return False


def gate_message(task: TaskSpec, summary: dict[str, Any]) -> str:
    """Why the gate said no, one failed check a line (the promotion gate's decision summary)."""
    failed = [r.get("message", str(r)) for r in summary.get("reasons") or [] if isinstance(r, dict) and not r.get("passed")]
    who = f"challenger v{summary['challenger_version']}" if summary.get("challenger_version") is not None else "the challenger"
    champion = summary.get("champion_after")
    stays = f"the champion stays v{champion}" if champion is not None else "there is still no champion"
    dry = " (dry run)" if summary.get("dry_run") else ""
    lines = [f"{task.task_id}: the gate REJECTED {who}{dry}; {stays}. Failed checks:"]
    lines += [f"  - {m}" for m in failed] or [f"  - {task.gate} is {summary.get(task.gate)!r} (no reason given)"]
    run = summary.get("gated_by") or summary.get("gate_run_id")
    lines.append(f"The whole decision is in the gate task's XCom and in the registry's gate run {run!r}. "
                 "Fix: distill a better student (or relax `promotion` in the "
                 "config), then trigger this DAG again.")
    return "\n".join(lines)


def check_params(params: dict[str, Any], specs: list[ParamSpec]) -> None:
    """Rules JSON schema cannot express (Airflow already checked types, enums and bounds)."""
    if "start" in params and "end" in params and params["start"] and params["end"]:
        try:
            start, end = dt.date.fromisoformat(str(params["start"])), dt.date.fromisoformat(str(params["end"]))
        except ValueError as exc:
            raise DeterministicError(f"params start/end must be dates like 2026-01-01: {exc}") from None
        if end <= start:
            raise DeterministicError(f"param end ({end}) must be after start ({start}); end is exclusive")
    known = {p.name for p in specs}
    unknown = sorted(set(params) - known)
    if unknown:
        raise DeterministicError(f"unknown params {unknown}; this DAG takes {sorted(known)}")


class NotYet(TaskError):
    """The step's input is a day that has not arrived (a windowed challenger is judged on the day
    after its window): not a failure and not a rejection; the run that brings the day does it."""


class OutsideRange(TaskError):
    """A scheduled or backfilled day that lies outside the config's `time_range` (what may be
    processed): nothing to do, and the DAG marks the task skipped rather than failed."""


# Airflow run types whose data interval is the day the run works on (a manual trigger keeps the
# form's date range; an asset-triggered run inherits no interval of its own)
INTERVAL_RUNS = frozenset({"scheduled", "backfill"})


def interval_params(params: dict[str, Any], specs: list[ParamSpec], run_type: str | None,
                    start: dt.datetime | None, end: dt.datetime | None, bounds) -> dict[str, Any]:
    """The run's parameters with `start`/`end` set to Airflow's data interval, clipped to the
    config's `time_range` (`bounds`), when the run is scheduled or backfilled and its form takes
    dates. Raises `OutsideRange` when the interval and the bounds do not meet."""
    names = {p.name for p in specs}
    if run_type not in INTERVAL_RUNS or not {"start", "end"} & names or start is None or end is None:
        return params
    lo, hi = max(start.date(), bounds.start), min(end.date(), bounds.end)
    if end.date() == start.date():  # an interval shorter than a day still names its day
        hi = min(start.date() + dt.timedelta(days=1), bounds.end)
    if hi <= lo:
        raise OutsideRange(f"the {run_type} run's data interval [{start.date()}, {end.date()}) lies outside the config's "
                           f"time_range [{bounds.start}, {bounds.end}): nothing to process (widen time_range to admit it)")
    dates = {"start": lo.isoformat(), "end": hi.isoformat()}
    return {**params, **{k: v for k, v in dates.items() if k in names}}  # a form with an end only takes the end


def stage_kwargs(stage_fn, task: TaskSpec, params: dict[str, Any], specs: list[ParamSpec]) -> dict[str, Any]:
    """The keywords to call the stage with. A parameter left at its default is dropped when the
    stage has no such keyword; a changed one the stage cannot take is an error (never ignored)."""
    sig = inspect.signature(stage_fn)
    # a `**params` stage may pass keywords on to a function that takes fewer: give it only
    # what the user changed, so an unsupported change still fails (with the callee's TypeError)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    accepts = {n for n, p in sig.parameters.items() if p.kind is not p.VAR_KEYWORD}
    default = {p.name: p.default for p in specs}
    kwargs: dict[str, Any] = {}
    for name, keyword in task.forward.items():
        value = params.get(name, default.get(name))
        if value is None:
            continue  # "use the stage's default"
        if keyword in accepts or (takes_any and value != default.get(name)):
            kwargs[keyword] = value
        elif value != default.get(name):
            raise DeterministicError(
                f"stage {task.stage!r} takes no {keyword!r} keyword, so param {name}={value!r} cannot be applied; "
                f"trigger with the default ({default.get(name)!r}) or extend the stage"
            )
    for keyword, value in task.fixed.items():
        if not (takes_any or keyword in accepts):
            raise DeterministicError(f"stage {task.stage!r} takes no {keyword!r} keyword (the DAG passes {keyword}={value!r})")
        kwargs[keyword] = value
    return kwargs


def _jsonable(value: Any) -> Any:
    """Strict JSON for XCom: NaN/inf become None (Airflow refuses them), unknown types become str."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return _jsonable(json.loads(json.dumps(value, default=str)))


def _links(summary: Any, config, paths: Paths) -> dict[str, str]:
    from lattice.orchestration.links import links_for

    try:
        return links_for(summary, config, paths) if isinstance(summary, dict) else {}
    except Exception as exc:  # a link is a convenience: it never fails a stage that succeeded
        log.warning("no links for this summary: %s: %s", type(exc).__name__, exc)
        return {}


def _log_summary(stage: str, summary: Any, seconds: float) -> None:
    from lattice.orchestration.story import summary_lines

    # the details first, then the short account a person reads first: the last lines of the log
    if isinstance(summary, dict):
        log.info("stage %s returned:", stage)
        for key, value in summary.items():
            if isinstance(value, (int, float, str, bool)) or value is None:
                log.info("  %s = %s", key, value)
            else:
                log.info("  %s = %s", key, json.dumps(value, default=str)[:300])
    log.info("stage %s finished in %.1f s", stage, seconds)
    for line in summary_lines(summary):
        log.info("  %s", line)


@dataclass
class RunContext:
    """What one run resolves once for every step it runs: the config (loaded with the run's own
    `--set` overrides), where it reads and writes (the deployment profile's paths, or the caller's),
    the run parameters (the data interval among them) and the extra keywords stages may take.
    A DAG task builds one for its single step; the demo and `lattice run` build one for all steps."""

    config: Any
    paths: Paths
    params: dict[str, Any] = field(default_factory=dict)
    """Run parameters (the DAG form's names: start, end, domains, epochs, nproc, ...)."""
    family_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Parameters for one family only, over `params` (the demo trains the student on 1 process)."""
    config_file: str | None = None
    overrides: list[str] = field(default_factory=list)
    """The run's own `--set KEY=VALUE` (kept when a step's form parameter sets another key)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Keywords handed to every stage that takes them (e.g. progress=False)."""

    def __post_init__(self) -> None:
        # the deployment profile, resolved here once for every step (a missing or unreadable
        # scale-out profile fails the run before its first stage, naming the file); the stages
        # read the engines bound to the config (lattice.deploy.profile.services)
        from lattice.deploy.profile import ProfileError, services

        try:
            self.services = services(self.config)
        except ProfileError as exc:
            raise DeterministicError(f"config {self.config.name!r}: {exc}") from None

    def params_for(self, task: TaskSpec, specs: list[ParamSpec]) -> dict[str, Any]:
        """The parameters of the task's DAG form: the run's, narrowed to what the form declares."""
        known = {p.name for p in specs}
        merged = {**self.params, **self.family_params.get(task.family, {})}
        return {k: v for k, v in merged.items() if k in known}


def run_task(config_file: str | Path, task: TaskSpec, params: dict[str, Any], specs: list[ParamSpec],
             interval: tuple[str | None, dt.datetime | None, dt.datetime | None] | None = None) -> dict[str, Any]:
    """Run one task of a DAG for the config in `config_file`; returns the stage's JSON summary.
    `interval` is (run type, data interval start, end) of the DAG run: a scheduled or backfilled
    run works on its own day (`interval_params`)."""
    return execute(dag_run_context(config_file, params, specs, interval), task, specs)


def dag_run_context(config_file: str | Path, params: dict[str, Any], specs: list[ParamSpec],
                    interval: tuple[str | None, dt.datetime | None, dt.datetime | None] | None) -> RunContext:
    """The context of a DAG task: its form's values checked, the config loaded once, and a
    scheduled or backfilled run's data interval applied to the dates."""
    from lattice.orchestration.locations import paths_for

    params = dict(params or {})
    check_params(params, specs)
    config = _load(str(config_file), [])
    if interval is not None:
        params = interval_params(params, specs, *interval, config.time_range)
        log.info("data interval of this %s run: [%s, %s)", interval[0], params.get("start"), params.get("end"))
    return RunContext(config, paths_for(config), params, config_file=str(config_file))


def run_steps(config_file: str | Path, steps, params: dict[str, Any], specs: list[ParamSpec],
              interval: tuple[str | None, dt.datetime | None, dt.datetime | None] | None = None) -> dict[str, dict[str, Any]]:
    """Run several steps of one DAG in order in this process (one Airflow task): the config is
    loaded and the parameters checked once, and every Spark step reuses the session the first
    one started. Each step logs a start line, its summary and its time, as a task of its own would.
    Returns each step's result by step id; a failing step stops the rest (named in the log)."""
    steps = list(steps)
    ctx = dag_run_context(config_file, params, specs, interval)
    results: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    for i, step in enumerate(steps, 1):
        log.info("==> step %d/%d %s (stage %s)", i, len(steps), step.task_id, step.stage)
        t = time.perf_counter()
        try:
            results[step.task_id] = execute(ctx, step, specs)
        except BaseException:
            left = [s.task_id for s in steps[i:]]
            log.error("step %d/%d %s failed after %.1f s%s", i, len(steps), step.task_id, time.perf_counter() - t,
                      f"; not run: {', '.join(left)}" if left else "")
            raise
        log.info("<== step %d/%d %s done in %.1f s", i, len(steps), step.task_id, time.perf_counter() - t)
    log.info("%d steps done in %.1f s: %s", len(steps), time.perf_counter() - started, ", ".join(results))
    return results


def _check_variant_inputs(task: TaskSpec, paths: RunPaths, staged: str | None, config) -> None:
    """A subset run reads the models of the same subset (a subset distill reads the teacher trained
    on those domains and objectives): stop with what to run first when one is missing, instead of
    reading the full model, whose heads and cells do not match the narrowed config."""
    for item in task.reads:
        kind, _, model = item.partition(":")
        if kind not in ("model", "artifact") or not model or model == staged:
            continue
        where = paths.model_dir(model)
        if not where.is_dir():
            raise DeterministicError(
                f"task {task.task_id!r} runs on domains {config.domain_names} and objectives {config.objective_names}, "
                f"a subset: it reads the {model} trained on the same subset, {where}, which does not exist. Run the "
                f"{model} step with the same domains and objectives first (subset runs never read or replace the full "
                f"models)")


def _load(config_file: str, sets: list[str]):
    from lattice.config import ConfigError, load_config

    try:
        return load_config(config_file, sets or None)
    except ConfigError as exc:
        raise DeterministicError(f"config {config_file} is invalid (fix the file; retrying cannot help):\n{exc}") from None


def execute(ctx: RunContext, task: TaskSpec, specs: list[ParamSpec]) -> dict[str, Any]:
    """Run one step of the pipeline in `ctx`: narrow the config to the run's subsets, stage a
    rewritten model folder in scratch, call the stage, swap on success; returns its JSON summary."""
    from lattice import stages

    params = ctx.params_for(task, specs)
    sets = [f"{key}={str(params[name]).lower() if isinstance(params[name], bool) else params[name]}"
            for name, key in task.config_sets.items() if params.get(name) is not None]
    if sets and ctx.config_file is None:
        raise DeterministicError(f"task {task.task_id!r}: params {sorted(task.config_sets)} set config keys, which needs "
                                 "the run's config file")
    if sets:
        from lattice.deploy.profile import bind

        config = bind(_load(ctx.config_file, [*ctx.overrides, *sets]), ctx.services)
    else:
        config = ctx.config
    stage = task.stage
    if task.switch and params.get(task.switch[0]):
        stage = task.switch[1]
    if stage not in stages.STAGES:
        raise DeterministicError(
            f"stage {stage!r} is not registered in lattice/stages.py (known: {sorted(stages.STAGES)}); "
            f"task {task.task_id!r} cannot run until the issue that builds this stage lands"
        )
    all_domains, all_objectives = config.domain_names, config.objective_names
    if task.narrow:
        from lattice.orchestration.narrow import SubsetError, narrow_config

        try:
            config = narrow_config(config, params.get("domains"), params.get("objectives"))
        except SubsetError as exc:
            raise DeterministicError(str(exc)) from None
    stage_fn = stages.get_stage(stage)
    kwargs = stage_kwargs(stage_fn, task, params, specs)
    accepts = inspect.signature(stage_fn).parameters
    kwargs.update({k: v for k, v in ctx.extra.items() if k in accepts and k not in kwargs})
    paths = run_paths = ctx.paths.ensure()
    table = None
    if config.domain_names != all_domains:
        try:
            table = subset_table(paths, config.domain_names)
        except Exception as exc:
            cls = DeterministicError if is_deterministic(exc) else TaskError
            raise cls(f"task {task.task_id!r}: the training table of domains {config.domain_names}: "
                      f"{type(exc).__name__}: {exc}") from exc
        log.info("domains %s of %s: the stage reads the subset table %s", config.domain_names, all_domains, table)
    staged = task.replaces_model if stage == task.stage else None
    # a subset run is its own model variant: it never replaces the full model in the work
    # directory, nor registers as the full model's latest version or challenger
    variant = subset_variant(all_domains, all_objectives, config.domain_names, config.objective_names)
    if table is not None or staged or variant:
        run_paths = RunPaths.make(paths, table=table, staged=staged, variant=variant).ensure()
    if variant:
        _check_variant_inputs(task, run_paths, staged, config)
    log.info("config %s (%s): stage %s with %s; workdir %s", config.name, ctx.config_file, stage, kwargs, paths.workdir)
    started = time.perf_counter()
    try:
        summary = stage_fn(config, run_paths, **kwargs)
        if staged:
            if isinstance(summary, dict) and summary.get("interrupted"):
                raise TaskError(f"stage {stage!r} stopped before the end; the previous {staged} model is kept")
            summary = relocate(summary, run_paths.commit())
    except Exception as exc:
        if staged:
            run_paths.discard()  # the previous model folder stays as it was
        if isinstance(exc, TaskError):
            raise
        from lattice.export.window import DayNotInTable

        if isinstance(exc, DayNotInTable):
            raise NotYet(f"task {task.task_id!r} waits: {exc}") from None
        cls = DeterministicError if is_deterministic(exc) else TaskError
        again = " (not retried: the same input fails the same way)" if cls is DeterministicError else ""
        raise cls(f"stage {stage!r} failed for config {config.name!r}{again}: {type(exc).__name__}: {exc}") from exc
    except BaseException:  # interrupted or killed (Ctrl-C, Airflow terminating the task)
        if staged:
            run_paths.discard()
        raise
    _log_summary(stage, summary, time.perf_counter() - started)
    result = {"stage": stage, "config": config.name, "summary": _jsonable(summary)}
    if variant:  # the DAG does not announce a subset's model as the config's (dags/lattice_dags.py)
        result["variant"] = variant
    links = _links(summary, config, ctx.paths)
    if links:  # where the results are: MLflow pages, report.html, per-cell metrics (XCom `links`)
        result["links"] = links
        log.info("links:\n%s", "\n".join(f"  {k}: {v}" for k, v in links.items()))
    if task.gate and stage == task.stage and not (isinstance(summary, dict) and summary.get(task.gate)):
        raise GateRejected(gate_message(task, summary if isinstance(summary, dict) else {}), result)
    return result
