"""lattice.relay: a child's warnings re-logged at WARNING, not at ERROR (Airflow's level for stderr);
a real failure stays ERROR and a non-zero exit code."""

from __future__ import annotations

import logging
import os
import sys
import textwrap

import pytest

from lattice import relay
from lattice.relay import level_of, run_child

CHILD = textwrap.dedent("""
    import logging, sys, warnings
    from lattice.relay import configure_child
    configure_child()
    logging.getLogger().setLevel(logging.ERROR)  # as training/distributed.py leaves it
    warnings.warn("careful: a library warning")
    print("[lattice] teacher epoch 1: train loss 0.5", flush=True)
    logging.getLogger("lattice.progress").info("synth: 1/1 rows (100%)")
    logging.getLogger().warning("root chatter stays silenced")
    sys.stderr.write("stray stderr\\n")
    sys.stderr.write("Traceback (most recent call last):\\n  File x\\nRuntimeError: unlogged crash\\n")
    logging.getLogger("lattice.x").warning("prefixed again")
    sys.stderr.write("stray again\\n")
    try:
        1 / 0
    except ZeroDivisionError:
        logging.getLogger("lattice.training.worker").exception("rank failed")
    sys.exit(3)
""")


@pytest.mark.parametrize("line, level", [
    ("WARNING [rank 1] py.warnings: x.py:3: UserWarning: w", logging.WARNING),
    ("ERROR [rank 0] lattice.training.worker: rank failed", logging.ERROR),
    ("INFO [rank 0] lattice.progress: synth: 1 rows", logging.INFO),
    ("W1201 08:00:00.123000 1234 torch/distributed/run.py:793] ****", logging.WARNING),
    ("[W1201 08:00:00.123456789 ProcessGroupGloo.cpp:514] Warning: x", logging.WARNING),
    ("[E socket.cpp:697] [c10d] failed", logging.ERROR),
    ("I1201 08:00:00.1 12 torch/x.py:1] info", logging.INFO),
    ("[rank1]:W1201 08:25:39.576000 9976 torch/fx/_symbolic_trace.py:56] is_fx_tracing", logging.WARNING),
    ("[rank0]:E1201 08:25:39.576000 9976 torch/x.py:1] bad", logging.ERROR),
    ("Traceback (most recent call last):", None),
    ("I am not a prefix", None),
    ("WARNINGS are plural here", None),
])
def test_level_of(line: str, level: int | None) -> None:
    assert level_of(line) == level


def test_child_warning_is_not_logged_at_error(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(relay, "is_terminal", lambda stream: False)  # as under Airflow, even with pytest -s
    log = logging.getLogger("lattice.test_relay")
    caplog.set_level(logging.DEBUG, logger=log.name)
    code, tail = run_child([sys.executable, "-c", CHILD], dict(os.environ), log)
    assert code == 3
    got = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == log.name]
    by_text = {m: lv for lv, m in got}

    def level(fragment: str) -> set[int]:
        return {lv for m, lv in by_text.items() if fragment in m}

    assert level("careful: a library warning") == {logging.WARNING}
    assert any(m.startswith("[rank 0] py.warnings: ") for m in by_text)  # level word moved into the record
    assert level("train loss 0.5") == {logging.INFO}
    assert level("synth: 1/1 rows") == {logging.INFO}
    assert level("stray stderr") == {logging.WARNING}
    assert level("root chatter") == set()
    assert level("unlogged crash") == level("File x") == level("Traceback") == {logging.ERROR}
    assert level("prefixed again") == level("stray again") == {logging.WARNING}
    # the logged failure: every line of its traceback at ERROR, and nothing else is
    errors = [m for lv, m in got if lv >= logging.ERROR and "unlogged crash" not in m and "File x" not in m
              and not m.startswith("Traceback")]
    assert errors[0].endswith("rank failed") and any("ZeroDivisionError" in m for m in errors)
    assert all(m.startswith("[rank 0] lattice.training.worker: ") for m in errors)
    assert any("ZeroDivisionError" in line for line in tail)
    assert not any("train loss" in line for line in tail)  # the tail is stderr only
