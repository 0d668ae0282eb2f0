"""A child process's output through this process's `logging`, each line at the level it names.

Airflow files all a task writes to stderr at ERROR. torchrun ranks that inherit the task's
stderr so turn every library warning, and every progress line, into an error in a task that
succeeds. Off a terminal, `run_child` pipes the child instead and re-logs what it writes: stdout
(the loop's prints) at INFO, stderr lines at the level their prefix names, unprefixed ones at
WARNING but for a traceback's, which are ERROR; the caller gets the exit code and stderr's tail.

The prefix comes from `configure_child()`, which a child started by `run_child` calls first.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections import deque
from typing import IO

from lattice.progress import is_terminal

ENV = "LATTICE_RELAYED_LOGS"  # set by run_child: the parent reads the prefixes, so write them
_NAMES = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR,
          "CRITICAL": logging.CRITICAL}
_GLOG = {"I": logging.INFO, "W": logging.WARNING, "E": logging.ERROR, "F": logging.CRITICAL}
# ours ("WARNING [rank 1] py.warnings: ..."), glog from torch's Python side ("W1201 08:00:00.1 ...",
# "[rank1]:W1201 ..." under torchrun), c10 from its C++ side ("[W1201 08:00:00.1 ...]", "[W socket.cpp:...]")
_OURS = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
_TORCH = re.compile(r"(?:\[rank\d+\]:)?(?:\[([IWEF])[\d ]|([IWEF])\d{4} )")


def level_of(line: str) -> int | None:
    """The level a line's prefix names, or None."""
    if m := _OURS.match(line):
        return _NAMES[m.group(1)]
    if m := _TORCH.match(line):
        return _GLOG[m.group(1) or m.group(2)]
    return None


class _EachLine(logging.Formatter):
    # Ranks share one pipe and a record may span lines (a traceback, a warning's source line):
    # a prefix on every line lets the parent place each line on its own.
    def format(self, record: logging.LogRecord) -> str:
        head = f"{record.levelname} [rank {os.environ.get('RANK', '0')}] {record.name}: "
        return "\n".join(head + line for line in super().format(record).splitlines() or [""])


def configure_child() -> None:
    """In a child started by `run_child`: records, and Python warnings, as prefixed stderr lines."""
    from lattice.quiet import library_notices

    library_notices()  # on a terminal too: the rank's own stderr is the user's
    if os.environ.get(ENV) != "1":
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_EachLine("%(message)s"))
    logging.getLogger().addHandler(handler)
    # The root level stays where the libraries left it (training/distributed.py sets ERROR against
    # torchrec's root-logger chatter); ours and Python warnings pass at their own levels.
    logging.getLogger("lattice").setLevel(logging.INFO)
    logging.getLogger("py.warnings").setLevel(logging.WARNING)
    logging.captureWarnings(True)


def _pump(stream: IO[str], log: logging.Logger, default: int, tail: deque[str] | None) -> None:
    unprefixed = default
    for raw in stream:
        line = raw.rstrip("\n")
        level = level_of(line)
        if level is not None:
            unprefixed = default
            if _OURS.match(line):
                line = line.split(" ", 1)[1]  # the level is the record's now; keep rank and logger
        elif line.startswith("Traceback (most recent call last):"):
            # a crash not logged by us (torchrun's own, a rank dying at import): an error to its end
            unprefixed = logging.ERROR
        log.log(unprefixed if level is None else level, "%s", line)
        if tail is not None:
            tail.append(line)


def _kill_tree(proc: subprocess.Popen) -> None:
    """End the child's whole session (torchrun and its ranks). Checkpoints are written to a
    temporary file and renamed, so a kill mid-save leaves the previous one intact."""
    import psutil

    try:  # torchrun starts each rank in a session of its own: collect the tree before killing it
        tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = [proc.pid]
    for pid in tree:
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL) if pid == proc.pid else os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def run_child(cmd: list[str], env: dict[str, str], log: logging.Logger, tail_lines: int = 40) -> tuple[int, list[str]]:
    """Run `cmd` to its end; returns (exit code, the last `tail_lines` lines of its stderr).
    On a terminal the child inherits it (rank 0 draws its bar there) and the tail is empty."""
    # Its own session: a Ctrl-C on the terminal reaches this process only, which then takes the
    # whole tree down at once, instead of torchrun and every rank each printing a traceback.
    if is_terminal(sys.stderr):
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        try:
            return proc.wait(), []
        except BaseException:
            _kill_tree(proc)
            raise
    tail: deque[str] = deque(maxlen=tail_lines)
    proc = subprocess.Popen(cmd, env={**env, ENV: "1", "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    # daemon: after an interrupt, a rank left holding a pipe must not keep this process alive
    pumps = [threading.Thread(target=_pump, args=(proc.stdout, log, logging.INFO, None), daemon=True),
             threading.Thread(target=_pump, args=(proc.stderr, log, logging.WARNING, tail), daemon=True)]
    for t in pumps:
        t.start()
    try:
        code = proc.wait()
    except BaseException:  # as subprocess.run does: an interrupted wait takes the child down
        _kill_tree(proc)
        raise
    for t in pumps:
        t.join()
    return code, list(tail)
