"""Where a DAG task's results are, as links for the Airflow run note.

A finished task's summary (its XCom) names MLflow runs and files by id and path; a person in the
Airflow UI wants to click them. `links_for` turns a summary into named targets: MLflow UI pages
when the registry is a tracking server (the config's `registry.tracking_uri`, else the scale-out
profile's), the local registry folder and run id otherwise; the work dir's report.html; the
monitoring report; the per-cell metrics. `run_note` renders them as the Markdown of a DAG run note.
Nothing here contacts MLflow: the links come from the summary and the config alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lattice.config import PlatformConfig
from lattice.paths import Paths

# summary key -> link name, in the order a note lists them
RUN_KEYS = (("run_id", "MLflow run"), ("gate_run_id", "MLflow gate decision"),
            ("next_day_run_id", "MLflow next-day series"), ("mlflow_run_id", "MLflow monitoring series"))


STAGE_LINKS: dict[str, tuple[str, ...]] = {
    "train": ("per-cell test metrics",),
    "evaluate": ("per-cell test metrics",),
    "distill": ("per-cell test metrics",),
    "register": ("MLflow run", "MLflow model version", "per-cell test metrics"),
    "gate": ("MLflow gate decision", "MLflow next-day series", "report"),
    "apply_gate": ("MLflow gate decision", "MLflow next-day series", "report"),
    "report": ("report",),
    "monitor": ("MLflow monitoring series", "monitoring report", "per-cell online metrics"),
}
"""Per stage, the links its task offers as Airflow extra links (lattice.orchestration.airflow_links):
the names `links_for` gives that stage's summary. A name the run has no target for shows greyed out."""


def clickable(target: str) -> str | None:
    """A target a browser can open from the Airflow UI: a URL as it is, an existing local file as a
    file:// URI (for copying; browsers do not follow them from a web page); None otherwise (a
    local MLflow run id names no page)."""
    if target.startswith(("http://", "https://")):
        return target
    path = Path(target)
    return path.resolve().as_uri() if path.is_absolute() and path.exists() else None


def tracking_server(summary: dict[str, Any], config: PlatformConfig) -> str | None:
    """The MLflow server's base URL, or None when the registry is the work dir's local one."""
    uri = summary.get("tracking_uri") or config.registry.tracking_uri
    if not uri:
        from lattice.deploy.profile import ProfileError, services

        try:
            uri = services(config).mlflow_tracking_uri
        except ProfileError:
            uri = None  # a note is no place to fail for a missing profile; the task itself said so
    return uri.rstrip("/") if uri and uri.startswith(("http://", "https://")) else None


def links_for(summary: dict[str, Any], config: PlatformConfig, paths: Paths) -> dict[str, str]:
    """Named link targets for one task's summary: URLs (http) or local paths. Files derived from
    the work dir are listed only when they exist, so a note never links to nothing."""
    summary = summary or {}
    server = tracking_server(summary, config)
    links: dict[str, str] = {}
    for key, name in RUN_KEYS:
        run_id = summary.get(key)
        if run_id:
            # MLflow's UI routes /runs/<id> to the run under its experiment
            links[name] = f"{server}/#/runs/{run_id}" if server else f"{paths.mlflow} (run {run_id})"
    if summary.get("registered_model") and summary.get("version") is not None and server:
        links["MLflow model version"] = f"{server}/#/models/{summary['registered_model']}/versions/{summary['version']}"
    report = paths.workdir / "report.html"
    if report.exists():
        links["report"] = str(report)
    from lattice.monitoring.stage import monitoring_dir

    monitoring = Path(summary["report"]) if summary.get("stage") == "monitor" and summary.get("report") \
        else monitoring_dir(paths) / "report.html"
    if monitoring.exists():
        links["monitoring report"] = str(monitoring)
    if summary.get("stage") == "monitor" and summary.get("metrics"):
        links["per-cell online metrics"] = str(summary["metrics"])
    model = summary.get("model")
    if model and (paths.model_dir(model) / "metrics.json").exists():
        links["per-cell test metrics"] = str(paths.model_dir(model) / "metrics.json")
    return links


def run_note(links: dict[str, str], title: str | None = None) -> str:
    """Markdown for a DAG run note: URLs as links, local paths as code (browsers do not open
    file:// links from a web page, so a path is for copying)."""
    lines = [f"**{title}**", ""] if title else []
    for name, target in links.items():
        if target.startswith(("http://", "https://")):
            lines.append(f"- [{name}]({target})")
        else:
            lines.append(f"- {name}: `{target}`")
    if not links:
        lines.append("- no MLflow run or report for this run")
    return "\n".join(lines)
