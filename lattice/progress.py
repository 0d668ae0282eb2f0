"""Progress of long loops: a tqdm bar on a terminal; anywhere else (Airflow task logs, CI) a plain
log line every LATTICE_PROGRESS_SECONDS (default 30) and one when the loop ends:

    synth: 150,000/150,000 rows (100%), 12.3 s, 12,200 rows/s

A bar redraws itself with carriage returns, which a log file keeps as one ever-growing line, and
Airflow files all a task writes to stderr at ERROR; the lines go through `logging` instead
(logger "lattice.progress", INFO).

TQDM_DISABLE=1 (or true/yes) shows nothing at all, neither bar nor lines, not even the last one:
it is how people silence tqdm, and a summary line is output they asked not to get. We read it
here, at each call: tqdm (4.70) reads TQDM_* once, at import, as defaults that any explicit
argument overrides, so call sites passing `disable=` never saw it; and it takes "0" as true.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any, Protocol

log = logging.getLogger("lattice.progress")

DEFAULT_SECONDS = 30.0
_TRUE = {"1", "true", "yes"}


class Progress(Protocol):
    """What call sites may use: tqdm's bar and `LineProgress` both have it."""

    n: int | float

    def __iter__(self) -> Iterator[Any]: ...
    def update(self, n: int | float = 1) -> Any: ...
    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None: ...
    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: object) -> Any: ...


def is_terminal(stream: IO[str] | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def _env_seconds() -> float:
    raw = os.environ.get("LATTICE_PROGRESS_SECONDS", "").strip()
    if not raw:
        return DEFAULT_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"LATTICE_PROGRESS_SECONDS={raw!r}: want the seconds between progress lines, a number >= 0")
    return value


def _rate(per_second: float) -> str:
    """Three significant figures: 12,200 rows/s, 45.6 batch/s, 0.123 batch/s."""
    if per_second >= 100:
        return f"{float(f'{per_second:.3g}'):,.0f}"
    return f"{per_second:.3g}"


class LineProgress:
    """tqdm's small interface, reported as a log line at most every `seconds` and once on close."""

    def __init__(self, iterable: Iterable[Any] | None, *, desc: str, unit: str, total: int | float | None,
                 initial: int | float, seconds: float, stream: IO[str] | None) -> None:
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except TypeError:
                pass
        self.iterable, self.desc, self.unit, self.total = iterable, desc, unit, total
        self.n = self._initial = initial
        self.seconds = seconds
        self.postfix = ""
        self._stream = stream
        self._started = self._last = time.monotonic()
        self._closed = False

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("this progress has no iterable; call update(n) instead")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:  # like tqdm: the end of the loop (or a break out of it) closes
            self.close()

    def update(self, n: int | float = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._last >= self.seconds:
            self._last = now
            self._emit(now)

    # `refresh` is tqdm's "redraw now"; lines keep to their clock, so it changes nothing here
    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None:
        items = {**dict(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = str(s)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._emit(time.monotonic())

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def line(self, now: float | None = None) -> str:
        elapsed = (time.monotonic() if now is None else now) - self._started
        done = f"{self.n:,} {self.unit}"
        if self.total:
            done = f"{self.n:,}/{self.total:,} {self.unit} ({self.n / self.total:.0%})"
        parts = [done, f"{elapsed:,.1f} s"]
        if elapsed > 0:
            parts.append(f"{_rate((self.n - self._initial) / elapsed)} {self.unit}/s")
        if self.postfix:
            parts.append(self.postfix)
        return f"{self.desc}: " + ", ".join(parts)

    def _emit(self, now: float) -> None:
        if log.hasHandlers():
            log.info("%s", self.line(now))
        else:
            # Like logging's last resort, which passes only WARNING and up: where nothing set up
            # logging (the CLI does not), a piped `lattice synth` must still show its progress.
            print(self.line(now), file=self._stream, flush=True)


def progress_bar(iterable: Iterable[Any] | None = None, *, desc: str, unit: str, total: int | float | None = None,
                 initial: int | float = 0, enabled: bool = True, leave: bool = True, file: IO[str] | None = None,
                 seconds: float | None = None) -> Progress:
    """A tqdm bar when `file` (default stderr) is a terminal; a `LineProgress` elsewhere, one line
    every `seconds` (default $LATTICE_PROGRESS_SECONDS or 30); a silent bar when not `enabled`
    or TQDM_DISABLE is true. `leave` only matters on a terminal (tqdm: keep the bar when done)."""
    stream = sys.stderr if file is None else file
    if not enabled or _env_true("TQDM_DISABLE"):
        from tqdm import tqdm

        return tqdm(iterable, desc=desc, unit=unit, total=total, initial=initial, disable=True)
    if is_terminal(stream):
        from tqdm import tqdm

        # disable=False explicitly: a TQDM_DISABLE=0 read by tqdm at import would disable the bar
        return tqdm(iterable, desc=desc, unit=unit, total=total, initial=initial, leave=leave, file=stream, disable=False)
    return LineProgress(iterable, desc=desc, unit=unit, total=total, initial=initial,
                        seconds=_env_seconds() if seconds is None else seconds, stream=stream)
