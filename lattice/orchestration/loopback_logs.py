"""Airflow's task-log servers (the scheduler's, for LocalExecutor, and the triggerer's) bind every
interface: `airflow.utils.serve_logs.core.serve_logs` passes `host=""` to uvicorn, with no setting
to change it. `airflow standalone` (the embedded profile) starts both and has no
`--skip-serve-logs`, so for an Airflow the platform starts on loopback this rebinds them there.

`install(host)` runs from `<AIRFLOW_HOME>/config/airflow_local_settings.py`, which Airflow imports
in every process before any command; the log server is a forked child of that process.
Scale-out starts each component itself and passes `--skip-serve-logs` instead.
"""

from __future__ import annotations

import os

HOST_ENV = "LATTICE_AIRFLOW_LOG_SERVER_HOST"

SETTINGS = ("# written by lattice (lattice/orchestration/loopback_logs.py): the task-log servers bind\n"
            "# the host Airflow was started for, not every interface\n"
            "from lattice.orchestration.loopback_logs import install\n\ninstall()\n")


class _BoundUvicorn:
    """uvicorn, with `run` bound to one host whatever host the caller passes."""

    def __init__(self, real, host: str):
        self._real, self._host = real, host

    def __getattr__(self, name: str):
        return getattr(self._real, name)

    def run(self, *args, **kwargs):
        kwargs["host"] = self._host
        return self._real.run(*args, **kwargs)


def install(host: str | None = None) -> str | None:
    """Bind Airflow's log servers in this process (and its forks) to `host` (default: the
    `LATTICE_AIRFLOW_LOG_SERVER_HOST` variable; unset: leave Airflow as it is). Returns the host."""
    host = host or os.environ.get(HOST_ENV)
    if not host:
        return None
    from airflow.utils.serve_logs import core

    if not isinstance(core.uvicorn, _BoundUvicorn):
        core.uvicorn = _BoundUvicorn(core.uvicorn, host)
    return host


def write_settings(home) -> None:
    """`<home>/config/airflow_local_settings.py` calling `install` (kept when one already exists)."""
    from pathlib import Path

    folder = Path(home) / "config"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "airflow_local_settings.py"
    if target.exists() and "loopback_logs" not in target.read_text():
        # an operator's own settings: append the call rather than replacing them
        target.write_text(target.read_text() + "\n" + SETTINGS)
    elif not target.exists():
        target.write_text(SETTINGS)
