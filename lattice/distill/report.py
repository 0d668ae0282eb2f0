"""Student vs teacher: cost ratios (params, FLOPs per example) and the NE gap per cell."""

from __future__ import annotations

from typing import Any

from lattice.config import PlatformConfig

COST_BUDGET = 0.2  # the student may have at most 1/5 of the teacher's parameters and FLOPs


def distill_report(config: PlatformConfig, teacher: dict, student: dict, no_teacher: dict | None = None) -> dict[str, Any]:
    """Arguments are models' metrics.json contents (cells, macro, cost)."""
    tc, sc = teacher.get("cost") or {}, student.get("cost") or {}
    ratios = {k: sc[k] / tc[k] for k in ("params", "embedding_params", "dense_params", "flops_per_example") if tc.get(k) and k in sc}
    cells = {}
    for d, o in config.cells():
        key = f"{d}/{o}"
        t, s = teacher["cells"].get(key, {}).get("ne"), student["cells"].get(key, {}).get("ne")
        row = {"teacher_ne": t, "student_ne": s}
        if t is not None and s is not None and t == t and s == s:
            row["gap"] = s - t
            row["relative_gap"] = s / t - 1
        if no_teacher is not None:
            row["no_teacher_ne"] = no_teacher["cells"].get(key, {}).get("ne")
        cells[key] = row
    t_ne, s_ne = teacher["macro"]["ne"], student["macro"]["ne"]
    eps = config.promotion.teacher_epsilon
    out: dict[str, Any] = {
        "cost": {"teacher": tc, "student": sc, "ratio": ratios,
                 "within_budget": bool(ratios) and all(ratios.get(k, 1.0) <= COST_BUDGET for k in ("params", "flops_per_example")),
                 "budget": COST_BUDGET},
        "macro": {"teacher_ne": t_ne, "student_ne": s_ne, "relative_gap": s_ne / t_ne - 1,
                  "within_epsilon": s_ne <= t_ne * (1 + eps), "epsilon": eps},
        "cells": cells,
    }
    if no_teacher is not None:
        n_ne = no_teacher["macro"]["ne"]
        out["macro"]["no_teacher_ne"] = n_ne
        out["macro"]["distillation_gain"] = n_ne - s_ne
    return out
