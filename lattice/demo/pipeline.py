"""The demo's stage sequence and the report it assembles from every stage's outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lattice.config import PlatformConfig
from lattice.demo.report import write_html
from lattice.demo.run import DemoRunner, write_json
from lattice.paths import Paths


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


# the teacher steps of a daily round (its baselines train once, on the first window); the id maps
# and the trees are fitted on the round's window as in the teacher DAG (a warm-started model keeps
# its parent's: refitted maps, the same forest)
ROUND_TEACHER_STEPS = ("fit_hashing", "fit_trees", "train_teacher", "evaluate_teacher", "register_teacher")


def run_demo(config: PlatformConfig, paths: Paths, rows: int, nproc: int = 2, epochs: int | None = None,
             serve_requests: int = 300, progress: bool = True, config_file: str | None = None,
             days: int = 0) -> dict[str, Any]:
    """Every step of the pipeline graph in order (the steps the DAGs run, through the same executor),
    then `days` daily rounds (lattice.demo.life: a new day's features, the warm-started teacher and
    student, the next-day gate), then a serving check; the report is written whatever happens.
    The report's models, headline and comparisons are the first window's, where every model is
    tested on the same day; the rounds are its `days` section."""
    from lattice.demo.life import plan, round_record, windowed
    from lattice.orchestration.graph import pipeline, select
    from lattice.orchestration.spec import dag_specs
    from lattice.orchestration.task_runner import RunContext
    from lattice.training.lineage import read as read_lineage

    life = plan(config, days)  # a time range too short for the rounds fails here, before any work
    overrides: list[str] = []
    if life is not None and config.training.window != life.window:
        config, overrides = windowed(config, life), [f"training.window={life.window}"]
    paths.ensure()
    runner = DemoRunner(config, paths)
    report: dict[str, Any] = {"rows": rows}
    specs = {d.family: d.params for d in dag_specs(config)}
    params: dict[str, Any] = {"synthetic_rows": rows}
    if epochs is not None:
        params["epochs"] = epochs
    summaries: dict[str, dict[str, Any]] = {}

    def context(round_=None) -> RunContext:
        # the teacher shards over `nproc` ranks; the student is small enough for one process
        run, model = dict(params), {}
        if round_ is not None:
            run.update(round_.feature_params())
            model = round_.model_params()
        return RunContext(config, paths, run, family_params={"train_teacher": {"nproc": nproc, **model},
                                                             "distill": {"nproc": 1, **model}},
                          config_file=config_file, overrides=overrides, extra={"progress": progress})

    try:
        ctx = context(life.rounds[0] if life else None)
        for step in select(pipeline(config)):
            result = runner.step(step.task_id, f"{step.family} · {step.task_id}: {step.doc}",
                                 lambda step=step: _run_step(ctx, step, specs[step.family]))
            summaries[step.task_id] = result.get("summary", {})
        report["pipeline"] = pipeline_section(summaries)
        if "fit_hashing" in summaries:
            report["hashing"] = summaries["fit_hashing"]
        report["distillation"] = summaries.get("distill_student")
        report["promotion"] = summaries.get("promote_challenger") or summaries.get("gate")  # the decision as carried out
        if life is not None:
            # the first window's models, before the rounds replace the teacher and the student
            report.update(collect(config, paths))
            report["days"] = {"window": life.window,
                              "rounds": [round_record(life.rounds[0], summaries, read_lineage(paths.model_dir("teacher")))]}
            for round_ in life.rounds[1:]:
                report["days"]["rounds"].append(_round(runner, context(round_), config, paths, round_, specs))
        from lattice.demo.serving_check import serving_check

        report["serving"] = runner.step("serve", f"serving check ({serve_requests} requests over HTTP)",
                                        lambda: serving_check(config, paths, serve_requests))
        report["status"] = "ok"
    except Exception as exc:
        report["status"] = "failed"
        report["error"] = f"{type(exc).__name__}: {exc}"
        report.setdefault("pipeline", pipeline_section(summaries))
    finally:
        try:
            if "models" not in report:
                report.update(collect(config, paths))
        except Exception as exc:  # a report without metrics still beats no report
            report.setdefault("error", f"collecting metrics failed: {type(exc).__name__}: {exc}")
        report["header"] = runner.header()
        report["timings"] = runner.timings()
        report["stages"] = [{"stage": r.name, "status": r.status, "error": r.error} for r in runner.records]
        write_json(paths.workdir / "report.json", report)
        write_html(report, paths.workdir / "report.html")
    return report


def _round(runner: DemoRunner, ctx, config: PlatformConfig, paths: Paths, round_, specs) -> dict[str, Any]:
    """One daily round: the new day's feature steps, the teacher continued on the days it has not
    seen, the student distilled from it, and the gate on the new day."""
    from lattice.demo.life import round_record
    from lattice.orchestration.graph import pipeline, select
    from lattice.training.lineage import read as read_lineage

    steps = [s for s in select(pipeline(config))
             if s.family in ("features", "distill", "promote") or s.task_id in ROUND_TEACHER_STEPS]
    summaries: dict[str, dict[str, Any]] = {}
    for step in steps:
        name = f"day{round_.index}.{step.task_id}"
        result = runner.step(name, f"day {round_.test_day} · {step.family} · {step.task_id}",
                             lambda step=step: _run_step(ctx, step, specs[step.family]))
        summaries[step.task_id] = result.get("summary", {})
    return round_record(round_, summaries, read_lineage(paths.model_dir("teacher")))


def _run_step(ctx, step, specs) -> dict[str, Any]:
    """One step through the DAGs' executor. A gate that says no is an outcome here, not a failure:
    the report shows the decision and every reason, and the serving check goes on with the champion
    (a second demo in the same workdir may well keep the first champion)."""
    from lattice.orchestration.task_runner import GateRejected, NotYet, execute

    try:
        return execute(ctx, step, specs)
    except GateRejected as exc:
        if step.gate:
            return exc.result
        raise
    except NotYet as exc:  # a windowed challenger whose next day is not in the table: judged later
        if step.gate:
            return {"stage": step.stage, "summary": {"decision": "wait", "passed": False, "reason": str(exc)}}
        raise


def pipeline_section(summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The feature steps' summaries -> per-domain rows in / out / quarantined / skipped."""
    cons = summaries.get("consolidate") or {}
    rec = {r["domain"]: {"in": r["rows_in"], "out": r["rows_out"], "quarantined": r["quarantined"], "skipped": r.get("skipped", 0)}
           for r in cons.get("reconciliation", [])}
    counts = {"consolidate": cons.get("totals", {})}
    if "training_set" in summaries:
        counts["training_set"] = summaries["training_set"].get("rows")
    timings = {name: s.get("seconds") for name, s in summaries.items() if isinstance(s, dict)}
    return {"reconciliation": rec, "quarantine_reasons": cons.get("quarantine_reasons", {}), "counts": counts,
            "timings": timings, "feature_services": (summaries.get("feast_apply") or {}).get("feature_services")}


def collect(config: PlatformConfig, paths: Paths) -> dict[str, Any]:
    """Per-model metrics, histories and costs from the model folders; the oracle; headline."""
    models: dict[str, Any] = {}
    for folder in sorted(paths.models.glob("*")) if paths.models.exists() else []:
        metrics = _read_json(folder / "metrics.json")
        if not metrics:
            continue
        history = _read_json(folder / "history.json")
        models[folder.name] = {
            "cells": metrics.get("cells", {}), "macro": metrics.get("macro", {}),
            "by_objective": metrics.get("by_objective", {}), "cost": metrics.get("cost"),
            "history": history, "calibration": metrics.get("calibration"),
        }
    oracle = {c: {"ne": v["oracle_ne"]} for m in models.values() for c, v in m["cells"].items() if "oracle_ne" in v}
    headline = {name: {o: v.get("ne") for o, v in m.get("by_objective", {}).items()} for name, m in models.items()}
    if oracle:
        headline["oracle"] = {
            o: sum(v["ne"] for c, v in oracle.items() if c.endswith(f"/{o}")) / max(1, sum(1 for c in oracle if c.endswith(f"/{o}")))
            for o in config.objective_names
        }
    from lattice.evaluation.versus import versus_trees

    return {"models": models, "oracle": {"cells": oracle}, "headline": headline, "vs_trees": versus_trees(models),
            "calibration_curves": _calibration_curves(config, paths, list(models)),
            "comparisons": _comparisons(config, paths, list(models))}


def _comparisons(config: PlatformConfig, paths: Paths, models: list[str]) -> list[dict[str, Any]]:
    """Every pair of trained models (teacher first) on their common test rows: the paired
    bootstrap NE difference per cell and macro (lattice.evaluation.compare)."""
    from lattice.demo.report import MODEL_ORDER
    from lattice.evaluation.compare import compare_models
    from lattice.evaluation.stages import load_test_predictions

    ordered = sorted(models, key=lambda m: (MODEL_ORDER.index(m) if m in MODEL_ORDER else len(MODEL_ORDER), m))
    return compare_models(config, load_test_predictions(paths, ordered))


def _calibration_curves(config: PlatformConfig, paths: Paths, models: list[str], bins: int = 10) -> dict[str, Any]:
    """Reliability points per model and cell from each model's test predictions (which carry
    the labels and masks next to the probabilities)."""
    import pandas as pd

    curves: dict[str, Any] = {}
    for model in models:
        pred_path = paths.model_dir(model) / "predictions.parquet"
        if not pred_path.exists():
            continue
        df = pd.read_parquet(pred_path)
        by_cell = {}
        for d, o in config.cells():
            needed = {f"p_{o}", f"label_{o}", f"mask_{o}"}
            if not needed <= set(df.columns):
                continue
            sel = df[(df["domain"] == d) & (df[f"mask_{o}"] > 0)]
            if len(sel) < bins * 5:
                continue
            q = pd.qcut(sel[f"p_{o}"], bins, duplicates="drop")
            g = sel.groupby(q, observed=True)
            by_cell[f"{d}/{o}"] = {"predicted": [float(x) for x in g[f"p_{o}"].mean()],
                                   "observed": [float(x) for x in g[f"label_{o}"].mean()]}
        if by_cell:
            curves[model] = by_cell
    return curves
