"""The `report` stage: rewrite <workdir>/report.html (and report.json) for the current champion.

The demo writes the report once, at its end; a DAG chain that later promotes another version
left that page describing the old champion. This stage runs after promotion and rebuilds the
page from what is on disk now: every model folder's test metrics, histories and predictions
(`lattice.demo.pipeline.collect`, the demo's own collector) and the registry's champion with
the gate decision that promoted it. It trains, scores and registers nothing, and it never writes
into a model folder or the registry: a work dir without a registry gets none.

The page is replaced atomically (written beside, then renamed), so a reader of report.html sees
the old page or the new one, never half of one.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from lattice.config import PlatformConfig
from lattice.paths import Paths

log = logging.getLogger(__name__)


def _registry(config: PlatformConfig, paths: Paths):
    """The registry to read, or None for a local one that does not exist (opening it would create it)."""
    from lattice.deploy.profile import services
    from lattice.registry.client import ModelRegistry, check_local_registry

    server = config.registry.tracking_uri or (services(config).mlflow_tracking_uri
                                              if config.deployment.profile != "embedded" else None)
    if not server:
        check_local_registry(paths.mlflow)  # a registry whose database vanished is an error, not "no champion"
        if not (paths.mlflow / "mlflow.db").exists():
            return None
    return ModelRegistry(config, paths)


def _decision(reg, run_id: str) -> dict[str, Any] | None:
    """decision.json of the gate run that promoted the champion (None when the run has none)."""
    from mlflow.artifacts import download_artifacts

    with tempfile.TemporaryDirectory() as tmp:
        try:
            f = download_artifacts(run_id=run_id, artifact_path="decision.json", dst_path=tmp,
                                   tracking_uri=reg.tracking_uri)
        except Exception as exc:  # an older run, or artifacts moved: the version's tags still say enough
            log.warning("report: decision.json of gate run %s could not be read: %s", run_id, exc)
            return None
        return json.loads(Path(f).read_text())


def champion_section(config: PlatformConfig, paths: Paths) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(champion, promotion) for the report: the champion version as the registry has it now,
    and the gate decision that made it champion (the report's "Promotion decision" section)."""
    from lattice.registry.client import CHAMPION

    reg = _registry(config, paths)
    if reg is None:
        return None, None
    info = reg.by_alias(CHAMPION)
    if info is None:
        return None, None
    champion = {"registered_model": info.name, "version": info.version, "model": info.model, "run_id": info.run_id,
                "gate_run_id": info.tags.get("lattice.gate.run_id"), "history": reg.champion_history(),
                "tracking_uri": reg.tracking_uri}
    decision = _decision(reg, champion["gate_run_id"]) if champion["gate_run_id"] else None
    if decision is not None and decision.get("challenger_version") != info.version:
        log.warning("report: gate run %s is about v%s, not champion v%s; not shown", champion["gate_run_id"],
                    decision.get("challenger_version"), info.version)
        decision = None
    if decision is None:
        # promoted without a gate record (by hand, or a rollback to a version that predates gate
        # records): say so instead of showing another version's decision
        decision = {"decision": "promoted without a gate record", "champion_after": info.version,
                    "challenger_version": info.version, "reasons": []}
    return champion, decision


def build(config: PlatformConfig, paths: Paths) -> dict[str, Any]:
    """The report dict the demo's renderer reads, for the champion as it is now."""
    from lattice.data.split import describe as describe_split
    from lattice.demo.pipeline import collect
    from lattice.demo.run import machine_info

    report: dict[str, Any] = {"status": "ok"}
    report.update(collect(config, paths))
    champion, promotion = champion_section(config, paths)
    report["champion"] = champion
    report["promotion"] = promotion
    report["header"] = {
        "config": config.name, "workdir": str(paths.workdir), "split": describe_split(config),
        "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine_info(),
    }
    return report


def _replace(path: Path, text: str) -> None:
    part = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    part.write_text(text)
    os.replace(part, path)


def report(config: PlatformConfig, paths: Paths, **_params: Any) -> dict[str, Any]:
    """Stage: rewrite report.html and report.json of the work dir for the current champion."""
    from lattice.demo.report import render_html

    started = time.perf_counter()
    if not paths.models.is_dir():
        raise FileNotFoundError(f"{paths.models} does not exist: the report describes trained models; run the "
                                f"training stages (or `lattice demo`) for this work dir first")
    rep = build(config, paths)
    seconds = round(time.perf_counter() - started, 2)
    rep["timings"] = [{"stage": "report", "title": "report refreshed from the model folders and the registry",
                       "seconds": seconds, "status": "ok"}]
    paths.workdir.mkdir(parents=True, exist_ok=True)
    _replace(paths.workdir / "report.json", json.dumps(rep, indent=2, default=str))
    _replace(paths.workdir / "report.html", render_html(rep))
    champion = rep["champion"]
    log.info("report: %s rewritten for %s", paths.workdir / "report.html",
             f"champion v{champion['version']}" if champion else "no champion")
    # the champion's ids under the keys links_for reads, so the task's run note links them
    return {"stage": "report", "report": str(paths.workdir / "report.html"), "models": sorted(rep["models"]),
            "champion_version": champion["version"] if champion else None,
            "registered_model": champion["registered_model"] if champion else None,
            "version": champion["version"] if champion else None, "model": champion["model"] if champion else None,
            "run_id": champion["run_id"] if champion else None,
            "gate_run_id": champion["gate_run_id"] if champion else None,
            "tracking_uri": champion["tracking_uri"] if champion else None, "seconds": seconds}
