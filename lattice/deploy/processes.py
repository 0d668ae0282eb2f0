"""Detached service processes we start ourselves, tracked by pid files in the state folder.

A pid file records the pid *and* the process's start time, so a stale file whose pid was reused
by someone else's process never makes us signal that process. Each service runs in its own
session (process group): stopping it stops the children it spawned (Spark executors, MLflow's
uvicorn workers) and nothing else.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil


def start(cmd: list[str], pidfile: Path, log: Path, env: dict[str, str], cwd: Path) -> int:
    """Start `cmd` detached (new session), stdout+stderr appended to `log`; returns its pid."""
    log.parent.mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True)
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    pidfile.write_text(json.dumps({"pid": proc.pid, "started": psutil.Process(proc.pid).create_time()}))
    return proc.pid


def running(pidfile: Path) -> psutil.Process | None:
    """The process the pid file names, if it is still the one we started."""
    try:
        rec = json.loads(pidfile.read_text())
        proc = psutil.Process(rec["pid"])
        if abs(proc.create_time() - rec["started"]) > 1 or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except (OSError, ValueError, KeyError, psutil.Error):
        return None


def stop(pidfile: Path, grace: float = 20.0) -> None:
    """SIGTERM the service's process group, SIGKILL what is left after `grace` seconds."""
    proc = running(pidfile)
    if proc is not None:
        group = _group(proc)
        _signal_all(group, signal.SIGTERM)
        _, alive = psutil.wait_procs(group, timeout=grace)
        _signal_all(alive, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=5)
    pidfile.unlink(missing_ok=True)


def kill(pidfile: Path) -> None:
    """SIGKILL the whole group at once (a node lost, for fault tests); the pid file stays."""
    proc = running(pidfile)
    if proc is not None:
        group = _group(proc)
        _signal_all(group, signal.SIGKILL)
        psutil.wait_procs(group, timeout=10)


def _group(proc: psutil.Process) -> list[psutil.Process]:
    # the leader and every descendant still in its session; children that started their own
    # session are theirs to manage, but a descendant is ours either way
    found = [proc]
    try:
        found += proc.children(recursive=True)
    except psutil.Error:
        pass
    return found


def _signal_all(procs: list[psutil.Process], sig: int) -> None:
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass


def wait_until(check, seconds: float, interval: float = 0.5) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval)
    return False


def base_env(**extra: str) -> dict[str, str]:
    """The environment of a service: ours minus anything that carries a secret by convention."""
    env = {k: v for k, v in os.environ.items() if not any(s in k for s in ("PASSWORD", "SECRET", "TOKEN"))}
    env.update(extra)
    return env
