"""Prometheus of the scale-out profile: Debian's `prometheus`, bound to 127.0.0.1, scraping every
running `lattice serve`.

Which servers run, and on which port, is known only when they start, so the scrape targets are
not in prometheus.yml: Prometheus reads them from file_sd target files in one folder
(`targets_dir`, named in the profile), and `lattice serve` writes one file there when it starts
and removes it when it stops (lattice/serving/scrape_target.py). Prometheus re-reads the folder
on its own; nothing is restarted when a server comes or goes. With several uvicorn workers on one
port, one target is enough: any worker answers /metrics with every worker's values summed
(prometheus-client's multiprocess mode).
"""

from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path

from lattice.deploy import processes as P
from lattice.deploy.local_services import Layout, ServiceError

JOB = "lattice-serving"
SCRAPE_SECONDS = 5  # a loopback profile: fresh figures matter more than the few bytes per scrape
RETENTION = "15d"


def root(layout: Layout) -> Path:
    return layout.home / "prometheus"


def targets_dir(layout: Layout) -> Path:
    return root(layout) / "targets"


def config_file(layout: Layout) -> Path:
    return root(layout) / "prometheus.yml"


def url(layout: Layout) -> str:
    return f"http://127.0.0.1:{layout.ports['prometheus']}"


def _pidfile(layout: Layout) -> Path:
    return root(layout) / "server.pid"


def render_config(targets: Path, scrape_seconds: int = SCRAPE_SECONDS) -> str:
    """prometheus.yml: one job whose targets are the JSON files under `targets` (YAML written by
    hand: every value is ours and plain, and the file stays readable)."""
    return "\n".join([
        "# written by `infra/scale-out up` (lattice/deploy/prometheus_server.py); rewritten on every start",
        "global:",
        f"  scrape_interval: {scrape_seconds}s",
        f"  evaluation_interval: {scrape_seconds}s",
        "scrape_configs:",
        f"  - job_name: {JOB}",
        "    metrics_path: /metrics",
        "    file_sd_configs:",
        "      - files:",
        f"          - '{targets}/*.json'",
        f"        refresh_interval: {scrape_seconds}s",
        "",
    ])


def _binary() -> str:
    exe = shutil.which("prometheus")
    if not exe:
        raise ServiceError("prometheus was not found: install Debian's `prometheus` package (infra/setup.sh does)")
    return exe


def start_prometheus(layout: Layout) -> None:
    if P.running(_pidfile(layout)) and prometheus_ready(layout):
        return
    P.stop(_pidfile(layout))
    exe = _binary()
    targets_dir(layout).mkdir(parents=True, exist_ok=True)
    config_file(layout).write_text(render_config(targets_dir(layout)))
    log = layout.logs / "prometheus.log"
    P.start([exe, f"--config.file={config_file(layout)}", f"--storage.tsdb.path={root(layout) / 'data'}",
             f"--storage.tsdb.retention.time={RETENTION}",
             f"--web.listen-address=127.0.0.1:{layout.ports['prometheus']}"],
            _pidfile(layout), log, P.base_env(), root(layout))
    if not P.wait_until(lambda: prometheus_ready(layout) or not P.running(_pidfile(layout)), 60) \
            or not prometheus_ready(layout):
        raise ServiceError(f"Prometheus did not answer within 60 s or exited; see {log}")


def prometheus_ready(layout: Layout) -> bool:
    try:
        with urllib.request.urlopen(url(layout) + "/-/ready", timeout=2) as r:
            return r.status == 200
    except Exception:
        return False


def stop_prometheus(layout: Layout) -> None:
    P.stop(_pidfile(layout))
