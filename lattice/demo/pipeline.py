"""The demo's stage sequence and the report it assembles from every stage's outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lattice.config import PlatformConfig
from lattice.config.schema import HASHING_NEEDS_FIT
from lattice.demo.report import write_html
from lattice.demo.run import DemoRunner, write_json
from lattice.paths import Paths


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def baseline_names(config: PlatformConfig) -> list[str]:
    b = config.models.baselines
    names = [n for n, on in (("separate", b.separate), ("pooled", b.pooled)) if on]
    if b.multitask != "none":
        names.append(b.multitask)
    # the LightGBM baselines: what every deep model must beat on the same split and features
    names += [n for n, on in (("gbdt", b.gbdt), ("gbdt_cell", b.gbdt_cell)) if on]
    return names


def run_demo(config: PlatformConfig, paths: Paths, rows: int, nproc: int = 2, epochs: int | None = None,
             serve_requests: int = 300, progress: bool = True) -> dict[str, Any]:
    from lattice.stages import run_stage

    paths.ensure()
    runner = DemoRunner(config, paths)
    report: dict[str, Any] = {"rows": rows}
    try:
        runner.step("synth", f"synthetic multi-domain logs ({rows:,} rows)",
                    lambda: run_stage("synth", config, paths, rows=rows, progress=progress))
        features = runner.step("features", "features: Spark consolidation, GX validation, Feast",
                               lambda: run_stage("features", config, paths))
        report["pipeline"] = pipeline_section(features)
        if any(f.hashing in HASHING_NEEDS_FIT for f in config.features.sparse):
            report["hashing"] = runner.step("hashing", "hashing fit: id maps of the compressed embeddings",
                                            lambda: run_stage("hashing_fit", config, paths))
        runner.step("teacher", f"MDMO teacher on TorchRec ({nproc} ranks)",
                    lambda: run_stage("train", config, paths, model="teacher", nproc=nproc, epochs=epochs, progress=progress))
        for b in baseline_names(config):
            runner.step(f"baseline_{b}", f"baseline: {b}",
                        lambda b=b: run_stage("train", config, paths, model=b, nproc=1, epochs=epochs, progress=progress))
        report["distillation"] = runner.step(
            "distill", "distilled student (teacher scores → student → export → registry)",
            lambda: run_stage("distill", config, paths, nproc=1, epochs=epochs, progress=progress))
        report["promotion"] = runner.step("promote", "promotion gate vs champion (MLflow registry)",
                                          lambda: run_stage("promote", config, paths))
        from lattice.demo.serving_check import serving_check

        report["serving"] = runner.step("serve", f"serving check ({serve_requests} requests over HTTP)",
                                        lambda: serving_check(config, paths, serve_requests))
        report["status"] = "ok"
    except Exception as exc:
        report["status"] = "failed"
        report["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            report.update(collect(config, paths))
        except Exception as exc:  # a report without metrics still beats no report
            report.setdefault("error", f"collecting metrics failed: {type(exc).__name__}: {exc}")
        report["header"] = runner.header()
        report["timings"] = runner.timings()
        report["stages"] = [{"stage": r.name, "status": r.status, "error": r.error} for r in runner.records]
        write_json(paths.workdir / "report.json", report)
        write_html(report, paths.workdir / "report.html")
    return report


def pipeline_section(summary: dict[str, Any]) -> dict[str, Any]:
    """The features stage summary -> per-domain rows in / out / quarantined / skipped."""
    rec = {r["domain"]: {"in": r["rows_in"], "out": r["rows_out"], "quarantined": r["quarantined"], "skipped": r.get("skipped", 0)}
           for r in summary.get("reconciliation", [])}
    return {"reconciliation": rec, "quarantine_reasons": summary.get("quarantine_reasons", {}),
            "counts": summary.get("counts", {}), "timings": summary.get("timings", {}),
            "feature_service": summary.get("feature_service")}


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
