"""A DAG task's results as Airflow extra links: the buttons on the task's page in the UI that open
the MLflow run, the gate decision, the report or the per-cell metrics of that very run.

Airflow 3 evaluates a task's extra links on the worker when the task ends and keeps each as an
XCom (`xcom_key`); the UI reads them from there, so no plugin has to be installed beside the API
server. Each link reads the `links` the task runner put in the task's result
(lattice.orchestration.links.links_for); which links a task offers follows its stage
(`STAGE_LINKS`). Imported by the DAG file only: it needs Airflow.
"""

from __future__ import annotations

import re
from typing import Any

import attrs
from airflow.sdk import BaseOperatorLink

from lattice.orchestration.links import STAGE_LINKS, clickable


@attrs.define()
class ResultLink(BaseOperatorLink):
    """One named target of a task's result."""

    label: str

    @property
    def name(self) -> str:
        return self.label

    @property
    def xcom_key(self) -> str:
        return "_link_lattice_" + re.sub(r"[^a-z0-9]+", "_", self.label.lower()).strip("_")

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        # at the end of the task, `ti_key` is the running task instance: its own result is readable
        result = ti_key.xcom_pull(task_ids=ti_key.task_id, key="return_value") if hasattr(ti_key, "xcom_pull") else None
        target = ((result or {}).get("links") or {}).get(self.label) if isinstance(result, dict) else None
        return (clickable(target) if target else None) or ""


def links_for_stages(stages: list[str]) -> tuple[ResultLink, ...]:
    """The extra links of a task that runs these stages, each name once, in stage order."""
    names: list[str] = []
    for stage in stages:
        names += [n for n in STAGE_LINKS.get(stage, ()) if n not in names]
    return tuple(ResultLink(n) for n in names)
