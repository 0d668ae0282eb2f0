"""The Spark driver JVM's own output through this process's `logging`, each line at its level.

pyspark starts the JVM with this process's stdout and stderr, and an Airflow task files all of
its stderr at ERROR: the JVM's start-up notes ("Using incubator modules", log4j's warnings) read
as errors in a task that succeeds. Off a terminal, `launch_relayed` starts the JVM (through
pyspark's own `launch_gateway`, which takes Popen keywords for this) with both streams piped,
and re-logs each line on the `pipelines.spark.jvm` logger: at the level its log4j prefix names
(the pattern of pipelines/log4j2.properties), a stack trace's lines at the level of the record
they follow, other lines at INFO (stdout) or WARNING (stderr). On a terminal the JVM keeps it.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
from typing import IO

from lattice.progress import is_terminal

log = logging.getLogger("pipelines.spark.jvm")
_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
           "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}
_PREFIX = re.compile(r"(TRACE|DEBUG|INFO|WARN|ERROR|FATAL) ")
# the rest of a logged exception: "\tat ...", "Caused by: ...", "\t... 12 more", "java.lang.X: msg"
# the JVM launcher's note about the flags Spark itself passes: nothing for a user to do
_LAUNCHER = re.compile(r"WARNING: Using incubator modules: ")
_TRACE = re.compile(r"\s+at |\s*\.\.\. \d+ more|Caused by: |Suppressed: |[\w$.]+(Exception|Error)(: |$)")


def levels(lines, default: int):
    """(level, line) of each non-empty line of the JVM's output; `\\r` separates lines too."""
    current = None
    for raw in lines:
        for line in raw.replace("\r", "\n").split("\n"):
            if not line.strip():
                continue
            if _LAUNCHER.match(line):
                yield logging.DEBUG, line
            elif m := _PREFIX.match(line):
                current = _LEVELS[m.group(1)]
                yield current, line
            elif current is not None and _TRACE.match(line):
                yield current, line
            else:
                current = None
                yield default, line


def _pump(stream: IO[bytes], default: int) -> None:
    text = (b.decode("utf-8", "replace").rstrip("\n") for b in stream)
    for level, line in levels(text, default):
        log.log(level, "%s", line)


def launch_relayed(conf) -> bool:
    """Start the JVM of the next SparkContext with its output relayed; False (nothing done) on a
    terminal, when this process already has a JVM, or under spark-submit (which started the JVM
    and set PYSPARK_GATEWAY_PORT)."""
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or is_terminal(sys.stderr) or "PYSPARK_GATEWAY_PORT" in os.environ:
        return False
    gateway = launch_gateway(conf, popen_kwargs={"stdout": subprocess.PIPE, "stderr": subprocess.PIPE})
    for stream, default in ((gateway.proc.stdout, logging.INFO), (gateway.proc.stderr, logging.WARNING)):
        threading.Thread(target=_pump, args=(stream, default), daemon=True, name="spark-jvm-log").start()
    SparkContext._ensure_initialized(gateway=gateway)
    return True
