"""Stage `tune`: an Optuna search over the config keys of `tune.space`, judged on the validation
split alone.

Every trial trains the model (one short run, `tune.epochs`) into its own folder
`models/<model>@trial<N>` with `validation_only=True`: the run stops at its best validation, reads
no test row and writes no model.pt; its objective is that validation's macro NE. The folder is
deleted when the trial ends (its figures live in the study, in MLflow and in best.json), so the
real `models/<model>` is never touched and a workdir does not fill with trial weights.

The study is a SQLite file, `<workdir>/tune/<study>/study.db` (`load_if_exists`): a rerun of the
same study runs only the trials still missing to reach the total, and a trial killed mid-run is
marked failed and not counted. Each trial is one MLflow run (params, validation NE per cell and
macro) in the experiment `lattice-<config>-tune-<study>` of the project's tracking store (the
workdir's SQLite registry, or `registry.tracking_uri`).

The best trial is written as `<workdir>/tune/<study>/overlay.yaml` (only the searched keys, as a
nested partial config) and as the `--set` flags `lattice train` takes.
"""

from __future__ import annotations

import json
import math
import shlex
import shutil
import time
from typing import Any

import yaml

from lattice.config import ConfigError, PlatformConfig
from lattice.config.loader import Problem, apply_overrides, parse_config
from lattice.paths import Paths
from lattice.tuning.space import as_overlay, as_sets, space_problems, suggest


TUNABLE = ("teacher",)
"""Models `lattice tune` searches. The student trains on the teacher's scores (distillation) and the
tree baselines have no epochs; neither is tuned here yet."""


def _source(config: PlatformConfig) -> str:
    return config.source_file or f"<config {config.name}>"


def _with(config: PlatformConfig, sets: list[str]) -> PlatformConfig:
    """The config with `--set`-style items applied, validated like a loaded file."""
    data = apply_overrides(config.model_dump(mode="json"), sets, _source(config))
    cfg = parse_config(data, _source(config))
    cfg._source_file = config.source_file
    return cfg


def check_space(config: PlatformConfig) -> None:
    """Every key names a value of this config, and every bound and choice makes a valid config;
    a ConfigError naming `tune.space.<key>` otherwise."""
    if not config.tune.space:
        raise ConfigError(_source(config), [Problem("tune.space", {}, "nothing to search: add keys with ranges, "
                                                   "e.g. training.lr_dense: {low: 0.0003, high: 0.01, log: true}")])
    problems = [Problem(p, v, m) for p, v, m in space_problems(config)]
    if problems:
        raise ConfigError(_source(config), problems)
    for key, spec in config.tune.space.items():
        for value in spec.choices if spec.choices is not None else [spec.low, spec.high]:
            try:
                _with(config, as_sets({key: value}))
            except ConfigError as exc:
                raise ConfigError(_source(config), [
                    Problem(f"tune.space.{key}", value, f"{key}={value!r} makes an invalid config ({p.path}: {p.message}); "
                            "narrow the range or the choices") for p in exc.problems]) from None


def _experiment(client, name: str, artifact_location: str | None) -> str:
    exp = client.get_experiment_by_name(name)
    return exp.experiment_id if exp else client.create_experiment(name, artifact_location=artifact_location)


def _fmt(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())


def tune(config: PlatformConfig, paths: Paths, model: str = "teacher", trials: int | None = None, epochs: int | None = None,
         study: str | None = None, timeout: float | None = None, nproc: int | None = None, progress: bool = True) -> dict:
    """Run the trials still missing for `trials` in total (default `tune.trials`) and write the best
    overlay. Returns a JSON-able summary (best trial, its validation NE, the `--set` flags)."""
    import optuna

    from lattice.registry.client import ModelRegistry
    from lattice.training.stages import train

    if model not in TUNABLE:
        raise ValueError(f"lattice tune searches {list(TUNABLE)}, not {model!r}")
    check_space(config)
    total = trials or config.tune.trials
    epochs = epochs or config.tune.epochs
    name = study or model
    folder = paths.tune_dir(name)
    folder.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{folder / 'study.db'}"
    space = {k: v.model_dump(mode="json", exclude_defaults=True) for k, v in config.tune.space.items()}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = (optuna.samplers.TPESampler(seed=config.tune.seed) if config.tune.sampler == "tpe"
               else optuna.samplers.RandomSampler(seed=config.tune.seed))
    st = optuna.create_study(study_name=name, storage=storage, direction="minimize", sampler=sampler, load_if_exists=True)
    made = {"model": model, "epochs": epochs, "space": space, "config": config.name}
    if not st.user_attrs:
        for k, v in made.items():
            st.set_user_attr(k, v)
    else:
        differs = [k for k, v in made.items() if st.user_attrs.get(k) != v]
        if differs:
            raise ValueError(f"study {name!r} ({folder / 'study.db'}) was made with other {', '.join(differs)} "
                             f"({ {k: st.user_attrs.get(k) for k in differs} }); its trials would not compare with "
                             f"these. Give another --study name, or move {folder} away to start afresh")
    State = optuna.trial.TrialState
    for t in st.get_trials(deepcopy=False, states=(State.RUNNING,)):
        st.tell(t.number, state=State.FAIL)  # a run killed mid-trial: not counted, run again
    done = len(st.get_trials(deepcopy=False, states=(State.COMPLETE,)))
    todo = max(0, total - done)

    registry = ModelRegistry(config, paths)  # the project's tracking store (SQLite under the workdir by default)
    client = registry.client
    experiment = f"lattice-{config.name}-tune-{name}"
    exp_id = _experiment(client, experiment, registry._artifact_location)
    data = config.model_dump(mode="json")
    cells = [f"{d}/{o}" for d, o in config.cells()]
    if progress:
        print(f"[lattice] tune {model}: study {name!r} has {done} of {total} trial(s); running {todo} "
              f"({epochs} epoch(s) each, validation split only) -> {folder}", flush=True)

    def objective(trial: "optuna.Trial") -> float:
        values = suggest(trial, config.tune.space, data)
        sets = as_sets(values)
        trial_config = _with(config, sets)
        run_name = f"{model}@trial{trial.number}"
        run = client.create_run(exp_id, run_name=run_name, tags={
            "lattice.model": model, "lattice.config": config.name, "lattice.tune.study": name,
            "lattice.tune.trial": str(trial.number), "lattice.split": "validation"})
        rid = run.info.run_id
        started = time.perf_counter()
        try:
            from mlflow.entities import Metric, Param

            client.log_batch(rid, params=[Param(k[:250], str(v)) for k, v in values.items()]
                             + [Param("tune.epochs", str(epochs)), Param("tune.trial", str(trial.number))])
            try:
                summary = train(trial_config, paths, model=run_name, nproc=nproc, epochs=epochs, progress=False,
                                validation_only=True)
                if summary.get("interrupted"):
                    raise RuntimeError(f"trial {trial.number}: training stopped before its end")
                figures = json.loads((paths.model_dir(run_name) / "val_metrics.json").read_text())
            finally:
                shutil.rmtree(paths.model_dir(run_name), ignore_errors=True)
            macro = float(figures["val_macro_ne"])
            per_cell = {c: float(v) for c, v in figures["val_ne"].items()}
            ms = [Metric("val_macro_ne", macro, 0, 0)] + [Metric(f"val_ne/{c}", v, 0, 0) for c, v in per_cell.items() if v == v]
            client.log_batch(rid, metrics=[m for m in ms if math.isfinite(m.value)])
            client.set_terminated(rid, "FINISHED")
        except BaseException:
            client.set_terminated(rid, "FAILED")
            raise
        trial.set_user_attr("val_ne", per_cell)
        trial.set_user_attr("best_epoch", figures.get("best_epoch"))
        trial.set_user_attr("seconds", round(time.perf_counter() - started, 1))
        trial.set_user_attr("mlflow_run_id", rid)
        if progress:
            prior = [t.value for t in st.get_trials(deepcopy=False, states=(State.COMPLETE,)) if t.value is not None]
            best = min(prior + [macro])
            print(f"[lattice] trial {trial.number} ({len(prior) + 1}/{total}): {_fmt(values)} -> val macro NE "
                  f"{macro:.4f} (best so far {best:.4f}) in {time.perf_counter() - started:.0f}s", flush=True)
        return macro if math.isfinite(macro) else math.inf

    if todo:
        st.optimize(objective, n_trials=todo, timeout=timeout)
    complete = st.get_trials(deepcopy=False, states=(State.COMPLETE,))
    if not complete:
        raise RuntimeError(f"study {name!r} has no completed trial yet ({folder / 'study.db'}); run it with --trials N")
    best = st.best_trial
    chosen = {k: best.params[k] for k in config.tune.space if k in best.params}
    sets = as_sets(chosen)
    where = config.source_file or "CONFIG"
    command = f"lattice train {shlex.quote(where)} --model {model} " + " ".join(f"--set {shlex.quote(s)}" for s in sets)
    overlay = folder / "overlay.yaml"
    head = (f"# lattice tune: best trial {best.number} of study {name!r} ({len(complete)} complete), "
            f"validation macro NE {best.value:.6f}\n# use: {command}\n")
    overlay.write_text(head + yaml.safe_dump(as_overlay(chosen), sort_keys=False))
    result = {
        "model": model, "study": name, "storage": storage, "trials_total": len(complete), "trials_run": todo,
        "best_trial": best.number, "best_val_macro_ne": best.value, "best_val_ne": best.user_attrs.get("val_ne", {}),
        "best_params": chosen, "sets": sets, "command": command, "overlay": str(overlay),
        "mlflow_experiment": experiment, "tracking_uri": registry.tracking_uri, "cells": cells,
    }
    (folder / "best.json").write_text(json.dumps(result, indent=1, default=str))
    return result
