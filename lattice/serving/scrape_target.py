"""The running server's entry in Prometheus' file_sd folder (scale-out profile).

`lattice serve` announces itself here so that the profile's Prometheus scrapes it without anyone
editing prometheus.yml (lattice/deploy/prometheus_server.py): one JSON file per server, named by
its port, written atomically (Prometheus never reads half a file) and removed when the server
stops. A server killed outright leaves its file; Prometheus then marks the target down (`up == 0`)
until a server on that port starts again and rewrites it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def scrape_host(host: str) -> str:
    """The address Prometheus (on loopback) reaches a server bound to `host` at."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::", "localhost") else host


def target_file(targets_dir: str | Path, port: int) -> Path:
    return Path(targets_dir) / f"lattice-serve-{port}.json"


def register(targets_dir: str | Path, host: str, port: int, labels: dict[str, str]) -> Path:
    """Write this server's target; returns the file (to `unregister` at exit)."""
    path = target_file(targets_dir, port)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps([{"targets": [f"{scrape_host(host)}:{port}"], "labels": labels}], indent=1))
    os.replace(tmp, path)
    return path


def unregister(path: Path) -> None:
    path.unlink(missing_ok=True)
