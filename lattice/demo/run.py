"""`lattice demo`: the whole platform on embedded defaults, stage by stage, into one report.

synthetic logs → features (Spark local[2], GX, Feast/SQLite) → sharded teacher (torchrun, 2 ranks)
and baselines → distilled student → gate + registry (MLflow/SQLite) → serving check → report.
Each stage is called through `lattice.stages`, timed, and its summary kept for the report.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import platform
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from lattice.data.split import describe as describe_split
from lattice.config import PlatformConfig
from lattice.paths import Paths


@dataclass
class StageRecord:
    name: str
    title: str
    seconds: float = 0.0
    status: str = "pending"
    summary: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def machine_info() -> dict[str, Any]:
    import torch

    mem = None
    try:
        with open("/proc/meminfo") as fh:
            mem = round(int(fh.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    return {
        "hostname": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count(),
        "memory_gib": mem, "python": platform.python_version(), "torch": torch.__version__,
        "gpu": torch.cuda.is_available(),
    }


class DemoRunner:
    """Runs named steps in order, printing a banner per stage; stops at the first failure but
    still writes the report, so a failed demo shows how far it got and why."""

    def __init__(self, config: PlatformConfig, paths: Paths, log: Callable[[str], None] | None = None):
        # flushed: stage lines must reach a log file or a CI console as they happen, not at exit
        log = log or functools.partial(print, flush=True)
        self.config, self.paths, self.log = config, paths, log
        self.records: list[StageRecord] = []

    def step(self, name: str, title: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        rec = StageRecord(name, title)
        self.records.append(rec)
        n = len(self.records)
        self.log(f"\n━━ [{n}] {title} ━━")
        started = time.perf_counter()
        try:
            rec.summary = fn() or {}
            rec.status = "ok"
        except Exception as exc:  # the report must still show what failed
            rec.status, rec.error = "failed", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"
            raise
        finally:
            rec.seconds = time.perf_counter() - started
            self.log(f"   {rec.status} in {rec.seconds:.1f}s")
        return rec.summary

    def timings(self) -> list[dict[str, Any]]:
        return [{"stage": r.name, "title": r.title, "seconds": r.seconds, "status": r.status} for r in self.records]

    def header(self) -> dict[str, Any]:
        return {
            "config": self.config.name, "workdir": str(self.paths.workdir), "split": describe_split(self.config),
            "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine_info(),
        }


def write_json(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))
    return path
