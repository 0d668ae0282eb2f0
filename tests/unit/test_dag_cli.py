"""`lattice airflow`: the command is wired, and --stop only touches what it started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from lattice.cli import build_parser
from lattice.orchestration import standalone


def test_airflow_command_is_listed_with_its_options() -> None:
    args = build_parser().parse_args(["airflow", "--port", "8181", "--stop"])
    assert args.port == 8181 and args.stop is True


def test_stop_without_a_started_airflow_says_so(tmp_path: Path, capsys) -> None:
    from lattice.cli import main

    assert main(["airflow", "--stop", "--home", str(tmp_path)]) == 0
    assert "no airflow standalone started" in capsys.readouterr().out


def test_stop_ends_the_recorded_process_group_only(tmp_path: Path) -> None:
    # a stand-in process group recorded the way `start` records airflow standalone
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    (tmp_path / standalone.STATE_FILE).write_text(json.dumps(
        {"home": str(tmp_path), "pid": proc.pid, "port": 1, "host": "127.0.0.1", "log_file": str(tmp_path / "x.log")}))
    assert standalone.running(tmp_path) is not None
    stopped = standalone.stop(tmp_path, timeout=10)
    assert stopped is not None and stopped.pid == proc.pid
    # stop reaped it (its exit status went to stop, not to proc.wait): the process is gone
    try:
        os.kill(proc.pid, 0)
        gone = False
    except ProcessLookupError:
        gone = True
    assert gone, "the recorded process still runs (or is an unreaped zombie) after stop"
    assert standalone.running(tmp_path) is None and not (tmp_path / standalone.STATE_FILE).exists()
