"""Stages `promote` and `rollback`.

promote: challenger and champion (as registered artifacts, downloaded from the registry) and the
teacher all score the same fresh evaluation window (the current table's test split); the
challenger's artifact is checked against its own training weights, timed and sized; the gate
decides; the decision and every reason go to MLflow; on a pass the `champion` alias moves.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from lattice.config import PlatformConfig
from lattice.paths import Paths

log = logging.getLogger(__name__)


def _teacher_cells(config: PlatformConfig, paths: Paths, registry, window):
    """The teacher's gate cells on the window: the latest registered teacher, else the local one."""
    from lattice.export.trained import load_trained
    from lattice.promotion.metrics import gate_cells

    latest = registry.latest("teacher")
    folder = registry.download(latest) if latest is not None else paths.model_dir("teacher")
    if not (folder / "model.pt").exists():
        return None, None
    trained = load_trained(folder)
    from lattice.data.loader import batch_from_frame

    batch = batch_from_frame(trained.config, trained.stats, window)
    with torch.no_grad():
        probs = {o: torch.sigmoid(v).numpy() for o, v in trained.model(batch.dense, batch.sparse, batch.domain).items()}
    return gate_cells(config, window, probs), (latest.version if latest else None)


def _artifact_parity(folder, predictor, window) -> float:
    """Max |Δp| between the registered artifact and the registered training weights next to it."""
    from lattice.export.trained import load_trained

    trained = load_trained(folder)
    batch = predictor.encode(window)
    got = predictor.predict_batch(batch)
    with torch.no_grad():
        want = {o: torch.sigmoid(v).numpy() for o, v in trained.model(batch.dense, batch.sparse, batch.domain).items()}
    return max(float(np.max(np.abs(got[o] - want[o]))) for o in want)


def promote(config: PlatformConfig, paths: Paths, dry_run: bool = False, max_rows: int = 200_000) -> dict[str, Any]:
    from lattice.export.predictor import Predictor
    from lattice.export.window import latency_ms, load_window
    from lattice.promotion.gate import GateInputs, decide
    from lattice.promotion.metrics import gate_cells, macro_ne
    from lattice.registry import CHALLENGER, CHAMPION, ModelRegistry
    from lattice.registry.checksum import size_mb

    started = time.perf_counter()
    reg = ModelRegistry(config, paths)
    challenger = reg.by_alias(CHALLENGER)
    if challenger is None:
        raise LookupError(f"registered model {reg.base_name!r} has no '{CHALLENGER}' version; run `lattice distill CONFIG` first")
    champion = reg.by_alias(CHAMPION)
    if champion is not None and champion.version == challenger.version:
        raise ValueError(f"the challenger v{challenger.version} already is the champion; distill a new student first")
    window = load_window(config, paths, "test", max_rows=max_rows)
    log.info("promote: challenger v%s vs champion %s on %d window rows", challenger.version,
             f"v{champion.version}" if champion else "(none)", len(window))

    ch_folder = reg.download(challenger)
    ch = Predictor.load(ch_folder, version=challenger)
    ch_cells = gate_cells(config, window, ch.predict_frame(window))
    champ_cells = None
    if champion is not None:
        champ = Predictor.load(reg.download(champion), version=champion)
        champ_cells = gate_cells(config, window, champ.predict_frame(window))
    teacher_cells, teacher_version = _teacher_cells(config, paths, reg, window)
    # the ε check compares the same cells (the challenger's) for student and teacher
    teacher_macro = macro_ne({c: m for c, m in teacher_cells.items() if c in ch_cells}) if teacher_cells else None
    parity = _artifact_parity(ch_folder, ch, window)
    lat = latency_ms(ch, window)
    mb = size_mb(ch.path)
    tolerance = config.promotion.int8_tolerance if ch.metadata.get("int8_embeddings") else config.promotion.export_tolerance
    inputs = GateInputs(
        challenger=ch_cells, champion=champ_cells, student_macro_ne=macro_ne(ch_cells), teacher_macro_ne=teacher_macro,
        export_max_abs_diff=parity, export_tolerance=tolerance, latency_p99_ms=lat["p99_ms"], artifact_mb=mb,
    )
    decision = decide(config.promotion, inputs).to_dict()
    measurements = {
        "window_rows": len(window), "student_macro_ne": inputs.student_macro_ne,
        "teacher_macro_ne": teacher_macro if teacher_macro is not None else float("nan"),
        "champion_macro_ne": macro_ne(champ_cells) if champ_cells else float("nan"),
        "export_max_abs_diff": parity, "latency_p50_ms": lat["p50_ms"], "latency_p99_ms": lat["p99_ms"], "artifact_mb": mb,
    }
    for (d, o), m in ch_cells.items():
        measurements[f"challenger.{d}.{o}.ne"] = m.ne
        if champ_cells and (d, o) in champ_cells:
            measurements[f"champion.{d}.{o}.ne"] = champ_cells[(d, o)].ne
    decision.update({
        "challenger_version": challenger.version, "champion_before": champion.version if champion else None,
        "teacher_version": teacher_version, "dry_run": dry_run, "measurements": measurements,
    })
    decision["champion_after"] = decision["champion_before"]
    if decision["passed"] and not dry_run:
        reg.promote(challenger)  # one alias write: servers see the old or the new champion, never neither
        decision["champion_after"] = challenger.version
    elif not decision["passed"]:
        log.warning("promote: challenger v%s rejected: %s", challenger.version,
                    "; ".join(r["message"] for r in decision["reasons"] if not r["passed"]))
    decision["gate_run_id"] = reg.log_decision(challenger, decision)
    decision["seconds"] = round(time.perf_counter() - started, 2)
    return decision


def rollback(config: PlatformConfig, paths: Paths) -> dict[str, Any]:
    from lattice.registry import ModelRegistry

    reg = ModelRegistry(config, paths)
    frm, to = reg.rollback()
    log.info("rollback: champion v%s -> v%s", frm, to)
    return {"from_version": frm, "to_version": to, "registered_model": reg.base_name}
