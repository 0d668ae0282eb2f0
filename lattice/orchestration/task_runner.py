"""How one Airflow task runs one platform stage: reload the config, check the run parameters,
pick the stage keywords, call it through `lattice.stages`, log its counts, return a JSON summary.

Stages write only where `Paths` says and replace their outputs, so a retried or re-run task
redoes its work instead of appending to it (idempotent).
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from lattice.orchestration.spec import ParamSpec, TaskSpec

log = logging.getLogger("lattice.orchestration")


class TaskError(RuntimeError):
    """A task that cannot run as asked; the message says what is wrong and what to do."""


def check_params(params: dict[str, Any], specs: list[ParamSpec]) -> None:
    """Rules JSON schema cannot express (Airflow already checked types, enums and bounds)."""
    if "start" in params and "end" in params and params["start"] and params["end"]:
        try:
            start, end = dt.date.fromisoformat(str(params["start"])), dt.date.fromisoformat(str(params["end"]))
        except ValueError as exc:
            raise TaskError(f"params start/end must be dates like 2026-01-01: {exc}") from None
        if end <= start:
            raise TaskError(f"param end ({end}) must be after start ({start}); end is exclusive")
    known = {p.name for p in specs}
    unknown = sorted(set(params) - known)
    if unknown:
        raise TaskError(f"unknown params {unknown}; this DAG takes {sorted(known)}")


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
            raise TaskError(
                f"stage {task.stage!r} takes no {keyword!r} keyword, so param {name}={value!r} cannot be applied; "
                f"trigger with the default ({default.get(name)!r}) or extend the stage"
            )
    for keyword, value in task.fixed.items():
        if not (takes_any or keyword in accepts):
            raise TaskError(f"stage {task.stage!r} takes no {keyword!r} keyword (the DAG passes {keyword}={value!r})")
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


def _log_summary(stage: str, summary: Any, seconds: float) -> None:
    log.info("stage %s finished in %.1f s", stage, seconds)
    if isinstance(summary, dict):
        for key, value in summary.items():
            if isinstance(value, (int, float, str, bool)) or value is None:
                log.info("  %s = %s", key, value)
            else:
                log.info("  %s = %s", key, json.dumps(value, default=str)[:500])


def run_task(config_file: str | Path, task: TaskSpec, params: dict[str, Any], specs: list[ParamSpec]) -> dict[str, Any]:
    """Run one task of a DAG for the config in `config_file`; returns the stage's JSON summary."""
    from lattice import stages
    from lattice.config import ConfigError, load_config
    from lattice.orchestration.locations import paths_for

    params = dict(params or {})
    check_params(params, specs)
    try:
        config = load_config(str(config_file))
    except ConfigError as exc:
        raise TaskError(f"config {config_file} is invalid:\n{exc}") from None
    stage = task.stage
    if task.switch and params.get(task.switch[0]):
        stage = task.switch[1]
    if stage not in stages.STAGES:
        raise TaskError(
            f"stage {stage!r} is not registered in lattice/stages.py (known: {sorted(stages.STAGES)}); "
            f"task {task.task_id!r} cannot run until the issue that builds this stage lands"
        )
    if task.narrow:
        from lattice.orchestration.narrow import SubsetError, narrow_config

        try:
            config = narrow_config(config, params.get("domains"), params.get("objectives"))
        except SubsetError as exc:
            raise TaskError(str(exc)) from None
    stage_fn = stages.get_stage(stage)
    kwargs = stage_kwargs(stage_fn, task, params, specs)
    paths = paths_for(config).ensure()
    log.info("config %s (%s): stage %s with %s; workdir %s", config.name, config_file, stage, kwargs, paths.workdir)
    started = time.perf_counter()
    try:
        summary = stage_fn(config, paths, **kwargs)
    except TaskError:
        raise
    except Exception as exc:
        raise TaskError(f"stage {stage!r} failed for config {config.name!r}: {type(exc).__name__}: {exc}") from exc
    _log_summary(stage, summary, time.perf_counter() - started)
    return {"stage": stage, "config": config.name, "summary": _jsonable(summary)}
