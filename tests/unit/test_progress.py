"""lattice.progress: a tqdm bar on a terminal, plain throttled log lines elsewhere, nothing under TQDM_DISABLE."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys

import pytest
from tqdm import tqdm

from lattice import progress as P
from lattice.progress import LineProgress, progress_bar


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.delenv("LATTICE_PROGRESS_SECONDS", raising=False)


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="lattice.progress")
    return caplog


FINAL = re.compile(r"^synth: 150,000/150,000 rows \(100%\), \d+\.\d s, [\d,.]+ rows/s$")


def test_off_a_terminal_it_logs_plain_lines_and_a_summary(logged: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()
    bar = progress_bar(total=150_000, desc="synth", unit="rows", file=stream, seconds=0)
    assert isinstance(bar, LineProgress)
    for _ in range(3):
        bar.update(50_000)
    bar.close()
    bar.close()  # a second close adds nothing
    msgs = [r.getMessage() for r in logged.records]
    assert len(msgs) == 4  # one per update at seconds=0, and the summary
    assert msgs[0].startswith("synth: 50,000/150,000 rows (33%), ")
    assert FINAL.match(msgs[-1]), msgs[-1]
    assert all("\r" not in m for m in msgs)
    assert {(r.name, r.levelno) for r in logged.records} == {("lattice.progress", logging.INFO)}
    assert stream.getvalue() == ""  # logging took it; nothing drawn on the stream


def test_lines_are_throttled_to_the_interval(logged: pytest.LogCaptureFixture) -> None:
    bar = progress_bar(total=1000, desc="synth", unit="rows", file=io.StringIO())  # 30 s default
    for _ in range(1000):
        bar.update(1)
    bar.close()
    assert len(logged.records) == 1 and logged.records[0].getMessage().startswith("synth: 1,000/1,000 rows (100%), ")


def test_interval_from_the_environment(monkeypatch: pytest.MonkeyPatch, logged: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("LATTICE_PROGRESS_SECONDS", "0")
    with progress_bar(total=5, desc="synth", unit="rows", file=io.StringIO()) as bar:
        for _ in range(5):
            bar.update()
    assert len(logged.records) == 6
    monkeypatch.setenv("LATTICE_PROGRESS_SECONDS", "soon")
    with pytest.raises(ValueError, match="LATTICE_PROGRESS_SECONDS"):
        progress_bar(total=5, desc="synth", unit="rows", file=io.StringIO())


def test_iteration_postfix_and_initial(logged: pytest.LogCaptureFixture) -> None:
    seen = []
    bar = progress_bar(range(4), desc="score teacher (all)", unit="batch", file=io.StringIO())
    for i in bar:
        seen.append(i)
        bar.set_postfix(loss=f"{0.5 / (i + 1):.4f}")
    assert seen == [0, 1, 2, 3] and bar.n == 4
    assert re.match(r"^score teacher \(all\): 4/4 batch \(100%\), .*, loss=0\.1250$", logged.records[-1].getMessage())
    # the epoch bar: no total, resumed mid-epoch
    with progress_bar(desc="teacher epoch 1/2", unit="batch", initial=10, file=io.StringIO()) as epoch:
        epoch.update(5)
        epoch.set_postfix_str("loss=0.3")
    assert epoch.n == 15
    assert re.match(r"^teacher epoch 1/2: 15 batch, .*, loss=0\.3$", logged.records[-1].getMessage())


def test_without_logging_set_up_it_prints_to_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(P.log, "propagate", False)  # no handler anywhere, as in the bare CLI
    stream = io.StringIO()
    with progress_bar(total=150_000, desc="synth", unit="rows", file=stream) as bar:
        bar.update(150_000)
    assert "\r" not in stream.getvalue()
    assert FINAL.match(stream.getvalue().rstrip("\n")), stream.getvalue()


@pytest.mark.parametrize("value", ["1", "true", "YES"])
def test_tqdm_disable_shows_nothing(monkeypatch: pytest.MonkeyPatch, logged: pytest.LogCaptureFixture, value: str) -> None:
    monkeypatch.setenv("TQDM_DISABLE", value)
    for stream in (io.StringIO(), FakeTTY()):
        with progress_bar(total=150_000, desc="synth", unit="rows", file=stream, seconds=0) as bar:
            bar.update(150_000)
            bar.set_postfix(loss="0.1")
        assert stream.getvalue() == ""
    assert list(progress_bar(range(3), desc="score", unit="batch", file=io.StringIO())) == [0, 1, 2]
    assert logged.records == []


def test_not_enabled_shows_nothing(logged: pytest.LogCaptureFixture) -> None:
    for stream in (io.StringIO(), FakeTTY()):
        with progress_bar(total=10, desc="synth", unit="rows", file=stream, enabled=False) as bar:
            bar.update(10)
        assert stream.getvalue() == ""
    assert logged.records == []


def test_on_a_terminal_it_is_a_tqdm_bar(logged: pytest.LogCaptureFixture) -> None:
    tty = FakeTTY()
    bar = progress_bar(total=100, desc="synth", unit="rows", file=tty)
    assert isinstance(bar, tqdm) and not bar.disable
    bar.update(100)
    bar.close()
    assert "\r" in tty.getvalue() and "synth" in tty.getvalue()
    assert logged.records == []


def test_tqdm_disable_0_keeps_the_bar_on() -> None:
    # tqdm reads TQDM_* at import and takes "0" as true, so this needs a fresh interpreter
    code = ("import io; from lattice.progress import progress_bar\n"
            "class T(io.StringIO):\n    def isatty(self): return True\n"
            "print(progress_bar(total=1, desc='d', unit='u', file=T()).disable)")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TQDM_DISABLE": "0"},
                         capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr
