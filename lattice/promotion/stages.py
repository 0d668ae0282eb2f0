"""Stages `promote` and `rollback`.

promote: challenger and champion (as registered artifacts, downloaded from the registry) and the
teacher all score the same fresh evaluation window (the current table's test split); the
challenger's artifact is checked against its own training weights, timed and sized; the gate
decides; the decision and every reason go to MLflow; on a pass the `champion` alias moves.

Before anything is scored, every registered artifact the gate uses is verified file by file
against what was recorded at registration; a mismatch is a rejection (check
`artifact_integrity`, naming the files), never a promotion. The challenger is checked twice:
through this machine's download cache and as stored in the artifact store (what every other
replica downloads once it is champion). The record and the move are one
step (`ModelRegistry.record_promotion`): a failure leaves the previous champion and history, and
a crash mid-move is settled (completed or undone) by the next promote or rollback.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from lattice.config import PlatformConfig
from lattice.paths import Paths

log = logging.getLogger(__name__)


def _teacher_cells(config: PlatformConfig, folder, window):
    """The teacher's gate cells on the window, from its (verified) registered folder or the local one."""
    from lattice.export.trained import load_trained
    from lattice.promotion.metrics import gate_cells

    if not (folder / "model.pt").exists():
        return None
    trained = load_trained(folder)
    from lattice.data.loader import batch_from_frame

    batch = batch_from_frame(trained.config, trained.stats, window, leaves=getattr(trained.model, "leaf_forest", None))
    with torch.no_grad():
        probs = {o: torch.sigmoid(v).numpy() for o, v in trained.model(batch.dense, batch.sparse, batch.domain).items()}
    return gate_cells(config, window, probs)


def _fp32_cells(config: PlatformConfig, folder, window):
    """The challenger's training weights in FP32 on the window, when its plan put any GEMM site in
    FP8 (the gate's fp8_parity check); None otherwise."""
    from lattice.data.loader import batch_from_frame
    from lattice.data.transforms import DenseStats
    from lattice.models.saved import blob_config, leaf_forest, read_blob, rebuild
    from lattice.promotion.metrics import gate_cells

    blob, _ = read_blob(folder)
    plan = blob.get("fp8") or {}
    if not any(s.get("choice", "fp32") != "fp32" for s in plan.get("sites", [])):
        return None
    trained_config = blob_config(blob)
    fp32 = rebuild({**blob, "fp8": None}, config=trained_config)
    batch = batch_from_frame(trained_config, DenseStats.from_json(blob["dense_stats"]), window, leaves=leaf_forest(blob))
    with torch.no_grad():
        probs = {o: torch.sigmoid(v).numpy() for o, v in fp32(batch.dense, batch.sparse, batch.domain).items()}
    return gate_cells(config, window, probs)


def _artifact_parity(folder, predictor, window) -> float:
    """Max |Δp| between the registered artifact and the registered training weights next to it."""
    from lattice.export.trained import load_trained

    trained = load_trained(folder)
    batch = predictor.encode(window)
    got = predictor.predict_batch(batch)
    with torch.no_grad():
        want = {o: torch.sigmoid(v).numpy() for o, v in trained.model(batch.dense, batch.sparse, batch.domain).items()}
    return max(float(np.max(np.abs(got[o] - want[o]))) for o in want)


def promote(config: PlatformConfig, paths: Paths, dry_run: bool = False, max_rows: int = 200_000,
            move: bool = True) -> dict[str, Any]:
    """Gate the challenger and, when it passes (and `move`, not `dry_run`), move the champion alias
    in the same step. `move=False` is the DAGs' `gate` step: the decision is recorded on the
    challenger and `apply_gate` (the `promote` step) carries it out."""
    from lattice.export.predictor import Predictor
    from lattice.export.window import latency_ms, load_window
    from lattice.promotion.gate import Decision, GateInputs, Reason, decide
    from lattice.promotion.metrics import gate_cells, macro_ne, paired_cells
    from lattice.registry import CHALLENGER, CHAMPION, ModelRegistry
    from lattice.registry.checksum import ArtifactIntegrityError, size_mb

    started = time.perf_counter()
    reg = ModelRegistry(config, paths)
    with reg.move_lock("promote (settling an interrupted move)"):
        settled = reg.reconcile()  # a crash mid-move: completed or undone before anything is read
    first = f"{settled}. " if settled else ""
    challenger = reg.by_alias(CHALLENGER)
    if challenger is None:
        raise LookupError(f"{first}registered model {reg.base_name!r} has no '{CHALLENGER}' version; run `lattice distill CONFIG` first")
    champion = reg.by_alias(CHAMPION)
    if champion is not None and champion.version == challenger.version:
        raise ValueError(f"{first}the challenger v{challenger.version} already is the champion; distill a new student first")
    from lattice.promotion import next_day

    day = next_day.judged_day(challenger.tags)  # windowed: the first day after its training window
    window = load_window(config, paths, "test", max_rows=max_rows, day=day)
    log.info("promote: challenger v%s vs champion %s on %d window rows%s", challenger.version,
             f"v{champion.version}" if champion else "(none)", len(window), f" of {day} (next day)" if day else "")

    # integrity first: every registered artifact the gate uses, checked before anything is scored
    integrity: list[Reason] = []

    def verified(info, role: str, servable: bool):
        try:
            folder = reg.download(info)  # every file against the manifest recorded at registration
            if role == "challenger":  # the copy every replica will download once it is champion
                reg.verify_stored(info)
            return folder, (Predictor.load(folder, version=info) if servable else None)  # the bytes loaded, again
        except ArtifactIntegrityError as exc:
            integrity.append(Reason("artifact_integrity", False, f"{role} v{info.version}: {exc}"))
            return None, None

    ch_folder, ch = verified(challenger, "challenger", True)
    champ = verified(champion, "champion", True)[1] if champion is not None else None
    latest_teacher = reg.latest("teacher")
    teacher_folder = verified(latest_teacher, "teacher", False)[0] if latest_teacher is not None else paths.model_dir("teacher")
    teacher_version = latest_teacher.version if latest_teacher is not None else None
    if integrity:
        decision = Decision(False, integrity).to_dict()
        decision.update({
            "challenger_version": challenger.version, "champion_before": champion.version if champion else None,
            "champion_after": champion.version if champion else None, "teacher_version": teacher_version,
            "dry_run": dry_run, "measurements": {"window_rows": len(window)},
        })
        log.warning("promote: challenger v%s rejected: %s", challenger.version, "; ".join(r.message for r in integrity))
        decision["gate_run_id"] = reg.log_decision(challenger, decision)
        decision["seconds"] = round(time.perf_counter() - started, 2)
        return decision
    checked = ", ".join(f"{role} v{info.version}" for role, info in
                        (("challenger", challenger), ("champion", champion), ("teacher", latest_teacher)) if info is not None)
    integrity_ok = Reason("artifact_integrity", True, f"{checked}: every file matches what was registered")

    ch_probs = ch.predict_frame(window)
    ch_cells = gate_cells(config, window, ch_probs)
    champ_probs = champ.predict_frame(window) if champ is not None else None
    champ_cells = gate_cells(config, window, champ_probs) if champ_probs is not None else None
    teacher_cells = _teacher_cells(config, teacher_folder, window)
    # the ε check compares the same cells (the challenger's) for student and teacher
    teacher_macro = macro_ne({c: m for c, m in teacher_cells.items() if c in ch_cells}) if teacher_cells else None
    parity = _artifact_parity(ch_folder, ch, window)
    lat = latency_ms(ch, window)
    mb = size_mb(ch.path)
    tolerance = config.promotion.int8_tolerance if ch.metadata.get("int8_embeddings") else config.promotion.export_tolerance
    inputs = GateInputs(
        challenger=ch_cells, champion=champ_cells, student_macro_ne=macro_ne(ch_cells), teacher_macro_ne=teacher_macro,
        export_max_abs_diff=parity, export_tolerance=tolerance, latency_p99_ms=lat["cpu_p99_ms"], artifact_mb=mb,
        fp8_fp32=_fp32_cells(config, ch_folder, window),
        paired=paired_cells(config, window, ch_probs, champ_probs) if champ_probs is not None else None,
    )
    decision = decide(config.promotion, inputs).to_dict()
    decision["reasons"].insert(0, asdict(integrity_ok))
    measurements = {
        "window_rows": len(window), "student_macro_ne": inputs.student_macro_ne,
        "teacher_macro_ne": teacher_macro if teacher_macro is not None else float("nan"),
        "champion_macro_ne": macro_ne(champ_cells) if champ_cells else float("nan"),
        "export_max_abs_diff": parity, "latency_p50_ms": lat["p50_ms"], "latency_p99_ms": lat["p99_ms"],
        "cpu_latency_p50_ms": lat["cpu_p50_ms"], "cpu_latency_p99_ms": lat["cpu_p99_ms"], "artifact_mb": mb,
    }
    for (d, o), m in ch_cells.items():
        measurements[f"challenger.{d}.{o}.ne"] = m.ne
        if champ_cells and (d, o) in champ_cells:
            measurements[f"champion.{d}.{o}.ne"] = champ_cells[(d, o)].ne
    decision.update({
        "challenger_version": challenger.version, "champion_before": champion.version if champion else None,
        "teacher_version": teacher_version, "dry_run": dry_run, "measurements": measurements,
        "judged_on": day, "day_index": next_day.day_index(config, day) if day else None,
        "series": next_day.series(config, day, {"challenger": ch_cells, "champion": champ_cells}) if day else {},
    })
    decision["champion_after"] = decision["champion_before"]
    if decision["passed"] and not dry_run and move:
        decision["champion_after"] = challenger.version
        # the record and the alias move as one step: a failure puts the previous champion back and raises
        decision["gate_run_id"] = reg.record_promotion(challenger, decision)
    else:
        if not decision["passed"]:
            log.warning("promote: challenger v%s rejected: %s", challenger.version,
                        "; ".join(r["message"] for r in decision["reasons"] if not r["passed"]))
        decision["gate_run_id"] = reg.log_decision(challenger, decision)
    if decision["series"]:
        decision["next_day_run_id"] = next_day.log_series(reg, decision["series"])
    decision["seconds"] = round(time.perf_counter() - started, 2)
    return decision


def gate(config: PlatformConfig, paths: Paths, dry_run: bool = False, rollback: bool = False,
         max_rows: int = 200_000) -> dict[str, Any]:
    """Stage `gate`: the promotion gate's decision, recorded on the challenger (its
    `lattice.gate.run_id` tag) and returned; it never moves the champion alias (`apply_gate`
    does). A rejection is a decision like a pass: the caller (`task_runner`) reads `passed`.
    A rollback run has nothing to judge: it passes through to the rollback after it."""
    if rollback:
        return {"passed": True, "decision": "rollback", "reasons": [], "rollback": True,
                "message": "a rollback run: nothing to gate; the promote step rolls the champion back"}
    return promote(config, paths, dry_run=dry_run, max_rows=max_rows, move=False)


def apply_gate(config: PlatformConfig, paths: Paths, dry_run: bool = False) -> dict[str, Any]:
    """Stage `apply_gate`: carry out the gate's recorded decision on the current challenger. A
    pass moves the champion alias (decision record, alias and history as one step,
    `ModelRegistry.record_promotion`, which re-verifies the stored copy and refuses if the
    champion moved since the gate); a reject is returned as is (`passed` false: the task is
    skipped, nothing moves); a dry run moves nothing."""
    import json
    import tempfile
    from pathlib import Path

    from lattice.registry import CHALLENGER, CHAMPION, ModelRegistry

    reg = ModelRegistry(config, paths)
    challenger = reg.by_alias(CHALLENGER)
    if challenger is None:
        raise LookupError(f"registered model {reg.base_name!r} has no '{CHALLENGER}' version to promote; "
                          "run the gate (`lattice run CONFIG --from gate`) on a registered student first")
    rid = challenger.tags.get("lattice.gate.run_id")
    if not rid:  # the gate waits for the challenger's next day (or never ran): nothing to carry out yet
        from lattice.orchestration.task_runner import NotYet

        raise NotYet(f"challenger v{challenger.version} has no gate decision yet (the gate runs first, and waits "
                     "while the challenger's next day is not in the table); nothing to promote")
    with tempfile.TemporaryDirectory() as tmp:
        decision = json.loads((reg._download_to(Path(tmp), run_id=rid, artifact_path="decision.json")).read_text())
    if decision.get("challenger_version") != challenger.version:
        raise ValueError(f"gate run {rid} judged v{decision.get('challenger_version')}, not the challenger "
                         f"v{challenger.version}; run the gate again")
    decision["gated_by"] = rid
    if not decision.get("passed"):
        return decision
    if dry_run or decision.get("dry_run"):
        log.info("promote: dry run: challenger v%s passed; the champion alias does not move", challenger.version)
        return {**decision, "dry_run": True, "moved": False}
    champion = reg.by_alias(CHAMPION)
    if champion is not None and champion.version == challenger.version:
        raise ValueError(f"the challenger v{challenger.version} already is the champion")
    decision["champion_after"] = challenger.version
    # the record and the alias move as one step; it refuses when the champion changed since the gate
    decision["gate_run_id"] = reg.record_promotion(challenger, decision)
    decision["moved"] = True
    return decision


def rollback(config: PlatformConfig, paths: Paths) -> dict[str, Any]:
    from lattice.registry import ModelRegistry

    reg = ModelRegistry(config, paths)
    frm, to = reg.rollback()
    log.info("rollback: champion v%s -> v%s", frm, to)
    out = {"from_version": frm, "to_version": to, "registered_model": reg.base_name}
    if reg.last_reconciled:  # a crashed move settled first: say so
        out["reconciled"] = reg.last_reconciled
    return out
