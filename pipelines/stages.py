"""The whole feature chain as one stage: ingest -> validate -> consolidate -> aggregates ->
Feast apply -> training set -> materialize. Writes `features_summary.json` in the workdir."""

from __future__ import annotations

import json
import time
from typing import Callable

if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lattice.config import PlatformConfig
from lattice.paths import Paths

# the Spark/Feast steps of the pipeline graph's features family, in the graph's order (the graph
# is the one declaration of the order; this stage runs those steps in one process, one Spark session)
JOBS = ("consolidate", "aggregates", "feast_apply", "training_set", "materialize")


def chain(config: PlatformConfig) -> list[str]:
    from lattice.orchestration.graph import steps_of

    return [s.stage for s in steps_of(config, "features") if s.stage in JOBS]


def _job(name: str) -> Callable[..., dict]:
    from pipelines import aggregates, consolidate, feast_jobs

    return {"consolidate": consolidate.ingest_and_consolidate, "aggregates": aggregates.build_aggregates,
            "feast_apply": feast_jobs.feast_apply, "training_set": feast_jobs.build_training_set,
            "materialize": feast_jobs.materialize}[name]


def summary_path(paths: Paths):
    return paths.workdir / "features_summary.json"


def run_features(config: PlatformConfig, paths: Paths, start: str | None = None, end: str | None = None,
                 domains: list[str] | None = None, master: str | None = None,
                 progress: Callable[[str, dict], None] | None = None) -> dict:
    """Run the chain; `progress(stage, result)` is called after each stage (the CLI prints it).
    On a validation failure the summary is written with status 'failed' and the error re-raised."""
    from pipelines.validate import ValidationFailed

    paths.ensure()
    t0 = time.perf_counter()
    summary: dict = {"config": config.name, "workdir": str(paths.workdir), "status": "running", "stages": {}}
    try:
        for name in chain(config):
            t = time.perf_counter()
            # the window applies to every stage (each replaces its days: pipelines.day_tables); the
            # domain filter only chooses what is (re)ingested: an aggregate counts all domains'
            # events, and the training set and online store serve every model
            scope = {"start": start, "end": end, **({"domains": domains} if name == "consolidate" else {})}
            res = _job(name)(config, paths, master=master, **scope)
            res["seconds"] = round(time.perf_counter() - t, 3)
            summary["stages"][name] = res
            if progress:
                progress(name, res)
    except ValidationFailed as exc:
        summary.update(status="failed", error=str(exc))
        _write(paths, summary, t0)
        raise
    cons = summary["stages"]["consolidate"]
    summary.update(
        status="ok", run_id=cons["run_id"],
        counts={
            "consolidate": cons["totals"],
            "quarantine_reasons": cons["quarantine_reasons"],
            "aggregates": {k: v["rows"] for k, v in summary["stages"]["aggregates"]["aggregates"].items()},
            "training_set": summary["stages"]["training_set"]["rows"],
        },
        # what the run read: date-partitioned sources list only the window's days
        raw_rows_read=cons.get("raw_rows_read"), empty_days=cons.get("empty_days", []),
        reconciliation=cons["reconciliation"],
        quarantine_reasons=cons["quarantine_reasons"],
        losses=cons.get("losses", []), raw_suite_findings=cons.get("raw_suite_findings", []),
        identical_rows={k: v.get("identical_rows", 0) for k, v in cons["sources"].items()},
        split=cons.get("split", {}),
        paths={"consolidated": str(paths.consolidated), "quarantine": str(paths.quarantine),
               "aggregates": str(paths.aggregates), "feast_repo": str(paths.feast_repo),
               "training_set": str(paths.training_set), "validation": str(paths.validation),
               "data_docs": cons["paths"]["data_docs"]},
        feature_services=summary["stages"]["feast_apply"]["feature_services"],
        timings={name: summary["stages"][name]["seconds"] for name in summary["stages"]},
    )
    _write(paths, summary, t0)
    return summary


def _write(paths: Paths, summary: dict, t0: float) -> None:
    summary.setdefault("timings", {})["total"] = round(time.perf_counter() - t0, 3)
    summary_path(paths).write_text(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    from pipelines.jobmain import main

    raise SystemExit(main(run_features, "the whole feature pipeline of a platform config"))
