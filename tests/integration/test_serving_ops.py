"""The prediction log and /metrics under real uvicorn processes: with two workers the per-cell
counts /metrics reports add up to the predictions sent, and a clean stop (SIGTERM) leaves every
acknowledged record on disk; a SIGKILL loses at most the last flush interval's records."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lattice.monitoring.compact import count_rows

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
pytestmark = pytest.mark.slow


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp_path: Path, workers: int, flush: float) -> tuple[subprocess.Popen, int]:
    port = _port()
    env = dict(os.environ, LATTICE_OPS_TEST_WORKDIR=str(tmp_path), LATTICE_OPS_TEST_FLUSH=str(flush),
               PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if workers > 1:
        (tmp_path / "metrics").mkdir()
        # what `lattice serve --workers N` sets (lattice.cli.serve_cmd)
        env.update(PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"), PROMETHEUS_MULTIPROCESS_DIR=str(tmp_path / "metrics"),
                   LATTICE_METRICS_MULTIPROC="1")
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "_ops_app:app", "--factory", "--port", str(port),
                             "--workers", str(workers), "--log-level", "warning"], env=env, cwd=tmp_path)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if _get(port, "/healthz")[0] == 200:
                return proc, port
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("uvicorn did not start")


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _connections(port: int, workers: int) -> list[http.client.HTTPConnection]:
    """One keep-alive connection per worker: connections are opened (and held) until each
    worker's pid has answered on one of them; the kernel, not the test, picks who accepts."""
    held, by_pid = [], {}
    deadline = time.time() + 60  # the second worker may still be starting when the first answers
    while time.time() < deadline:
        if len(held) > 50:  # the kernel keeps handing connections to one worker: let it settle
            for c in held:
                c.close()
            held = []
            time.sleep(0.5)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/healthz")
        pid = json.loads(conn.getresponse().read())["pid"]
        (held if pid in by_pid else by_pid.setdefault(pid, [])).append(conn)
        if len(by_pid) == workers:
            break
    for c in held:
        c.close()
    return [c for conns in by_pid.values() for c in conns]


def _send(port: int, n: int, workers: int = 1) -> int:
    """n predictions spread over every worker; how many workers answered."""
    conns = _connections(port, workers)
    for i in range(n):
        conn = conns[i % len(conns)]
        body = {"request_id": f"r{i}", "domain": ["feed", "search", "video"][i % 3], "entities": {"user_id": i, "ad_id": 1}}
        conn.request("POST", "/predict", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        resp.read()
    for c in conns:
        c.close()
    return len(conns)


def _log_rows(workdir: Path) -> int:
    return count_rows(workdir / "prediction_log")


def test_two_workers_count_every_prediction_and_a_clean_stop_keeps_the_log(tmp_path):
    proc, port = _start(tmp_path, workers=2, flush=3600.0)  # only the stop can write the log
    try:
        workers = _send(port, 60, workers=2)
        families = {f.name: f for f in text_string_to_metric_families(_get(port, "/metrics")[1].decode())}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert workers == 2, "both workers should have answered"
    counts = {(s.labels["domain"], s.labels["objective"]): s.value for s in families["lattice_predictions"].samples
              if s.name == "lattice_predictions_total"}
    assert sum(v for (d, o), v in counts.items() if o == "click") == 60
    assert counts[("feed", "click")] == 20 and counts[("video", "click")] == 20
    assert _log_rows(tmp_path) == 60


def test_sigkill_loses_at_most_the_last_flush_interval(tmp_path):
    proc, port = _start(tmp_path, workers=1, flush=0.2)
    try:
        _send(port, 30)
        deadline = time.time() + 30  # flush_seconds is 0.2: written within a few intervals (a loaded machine: more)
        while (health := json.loads(_get(port, "/healthz")[1]))["prediction_log"]["written"] < 30 and time.time() < deadline:
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert _log_rows(tmp_path) == 30, health
    assert health["prediction_log"]["written"] == 30 and health["prediction_log"]["dropped"] == {}
    assert not list((tmp_path / "prediction_log").rglob(".*.tmp"))  # no half-written part left behind
