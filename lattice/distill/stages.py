"""The `distill` stage: teacher scores -> student trained on labels + soft labels -> evaluation
-> cost/NE report -> export -> registry (teacher logged, student registered as challenger).

    teacher (trained) --score train split--> teacher_scores/teacher_train.parquet (example_id, p_<o>)
    student = train(..., teacher_scores=...)   # loss: labels + soft labels, unlabeled rows weighted
"""

from __future__ import annotations

import json
import logging
import time

from lattice.config import PlatformConfig
from lattice.paths import Paths

log = logging.getLogger(__name__)

NO_TEACHER = "student@noteacher"


def _metrics(paths: Paths, model: str) -> dict:
    return json.loads((paths.model_dir(model) / "metrics.json").read_text())


def _register_teacher_once(config: PlatformConfig, paths: Paths) -> dict:
    """Log the teacher unless its current weights are already the latest registered teacher."""
    from lattice.registry import ModelRegistry
    from lattice.registry.checksum import sha256_path
    from lattice.registry.stages import register

    latest = ModelRegistry(config, paths).latest("teacher")
    if latest is not None and latest.tags.get("lattice.checksum") == sha256_path(paths.model_dir("teacher")):
        return {"model": "teacher", "version": latest.version, "already_registered": True}
    return register(config, paths, "teacher")


def distill(config: PlatformConfig, paths: Paths, nproc: int | None = None, epochs: int | None = None,
            seed: int | None = None, compare_without_teacher: bool = False, export: bool = True,
            register: bool = True, progress: bool = True, end: str | None = None, data_end: str | None = None,
            warm_start: str | None = None) -> dict:
    """`end` / `data_end`: the interval end of a windowed run (training.window); default the
    teacher's own window end (its lineage), so the student trains and is judged on the teacher's days,
    holding out the share of the newest day that the teacher held out.
    With training.warm_start (or `warm_start`, which overrides it) the student continues from the
    last student (or the champion)."""
    from lattice.evaluation.stages import evaluate
    from lattice.training.stages import score, train

    teacher_dir = paths.model_dir("teacher")
    if not (teacher_dir / "model.pt").exists():
        raise FileNotFoundError(f"no trained teacher at {teacher_dir}; run `lattice train CONFIG --model teacher` first")
    if register and not config.registry.tracking_uri:
        # before minutes of training: a registry that vanished is an error now, not at the end
        from lattice.registry.client import check_local_registry

        check_local_registry(paths.mlflow)
    started = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(name: str, t: float) -> None:
        timings[name] = round(time.perf_counter() - t, 2)
        log.info("distill: %s done in %.1fs", name, timings[name])

    from lattice.training.lineage import read as read_lineage

    teacher_lineage = read_lineage(teacher_dir) or {}
    end = end or data_end or (teacher_lineage.get("window") or {}).get("end")
    # the student holds out what its teacher held out: a retrain a rule started trains both on
    # the rest of the tripped day (monitoring.retrain_validation_share), and is judged alike
    share = (teacher_lineage.get("splits") or {}).get("validation_share")
    t = time.perf_counter()
    scores = score(config, paths, "teacher", split="train", out=paths.teacher_scores / "teacher_train.parquet", progress=progress)
    lap("score_teacher", t)
    t = time.perf_counter()
    train(config, paths, "student", nproc=nproc, epochs=epochs, teacher_scores=scores, seed=seed, progress=progress, end=end,
          warm_start=warm_start, validation_share=share)
    lap("train_student", t)
    models = ["teacher", "student"]
    if compare_without_teacher:
        # the same small network on labels only: what the teacher's soft labels are worth
        t = time.perf_counter()
        train(config, paths, NO_TEACHER, nproc=nproc, epochs=epochs, seed=seed, progress=progress, end=end,
              warm_start="none", validation_share=share)
        lap("train_student_without_teacher", t)
        models.append(NO_TEACHER)
    evaluate(config, paths, models)
    from lattice.distill.report import distill_report

    report = distill_report(config, _metrics(paths, "teacher"), _metrics(paths, "student"),
                            _metrics(paths, NO_TEACHER) if compare_without_teacher else None)
    if not report["cost"]["within_budget"]:
        log.warning("the student exceeds 1/5 of the teacher's cost: %s; shrink models.student", report["cost"]["ratio"])
    paths.reports.mkdir(parents=True, exist_ok=True)
    (paths.reports / "distillation.json").write_text(json.dumps(report, indent=1))
    out: dict = {"teacher_scores": str(scores), "report": str(paths.reports / "distillation.json"),
                 "cost_ratio": report["cost"]["ratio"], "within_cost_budget": report["cost"]["within_budget"],
                 "macro": report["macro"]}
    if export:
        from lattice.export.stages import export_model

        t = time.perf_counter()
        out["export"] = export_model(config, paths, "student")
        lap("export", t)
    if register:
        from lattice.registry.stages import register as register_model

        t = time.perf_counter()
        out["teacher_version"] = _register_teacher_once(config, paths)["version"]
        out["student"] = register_model(config, paths, "student")
        lap("register", t)
    out["timings"] = timings
    out["seconds"] = round(time.perf_counter() - started, 2)
    return out

