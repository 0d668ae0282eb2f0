"""Issue 37 finding 8: Airflow's task-log servers bind the host the platform starts Airflow for
(127.0.0.1), not 0.0.0.0 and [::] (Airflow hard-codes host="" for them)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lattice.orchestration.airflow_env import local_airflow_env
from lattice.orchestration.loopback_logs import HOST_ENV, write_settings

ROOT = Path(__file__).resolve().parents[2]

_PROBE = """
import multiprocessing, sys
from airflow.utils.serve_logs import serve_logs   # airflow_local_settings has run by now
multiprocessing.Process(target=serve_logs, kwargs={"port": int(sys.argv[1])}, daemon=True).start()
import time; time.sleep(60)
"""


def _listening(port: int) -> list[str]:
    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout
    return [line.split()[3] for line in out.splitlines() if line.strip()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_the_log_server_of_an_airflow_started_for_loopback_listens_only_there(tmp_path):
    home = tmp_path / "airflow"
    write_settings(home)
    port = _free_port()
    env = {**os.environ, **local_airflow_env(home, log_ports=(port, _free_port())), HOST_ENV: "127.0.0.1",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-c", _PROBE, str(port)], env=env, cwd=home, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 90
        while not (bound := _listening(port)) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.5)
        assert bound == [f"127.0.0.1:{port}"], (bound, proc.stderr.read().decode()[-2000:] if proc.poll() is not None else "")
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def test_the_settings_file_keeps_an_operators_own_settings(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "airflow_local_settings.py").write_text("MINE = 1\n")
    write_settings(tmp_path)
    write_settings(tmp_path)  # idempotent
    text = (tmp_path / "config" / "airflow_local_settings.py").read_text()
    assert text.startswith("MINE = 1\n") and text.count("install()") == 1
