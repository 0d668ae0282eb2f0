"""Hot swap: the served model lives in one slot; a watcher loads a new champion beside it and
then replaces the slot's reference in one assignment.

A request reads `slot.current` once and uses that object to the end, so it always sees one
complete model: the old one if it started before the swap, the new one after. Loading,
warm-up and any load failure happen off the request path; a failed load leaves the old
model serving and is reported by /healthz.

An artifact that fails verification (its bytes are not the registered ones) is refused: the old
model keeps serving, /healthz's last_error says which files differ, and that version is not
downloaded again on every poll, only after `refused_retry_seconds` (or when the alias moves).

The slot also keeps what the registry named at the last poll and why the served version is not
that one (`state()`): /healthz and /metadata report it, and say "ok" only when the two agree.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

from lattice.registry.checksum import ArtifactIntegrityError

log = logging.getLogger(__name__)

M = TypeVar("M")


@dataclass(frozen=True)
class Served(Generic[M]):
    version: int
    model: M
    loaded_at: float


class ModelSlot(Generic[M]):
    def __init__(self, current_version: Callable[[], int | None], load: Callable[[int], M], poll_seconds: float = 2.0,
                 refused_retry_seconds: float = 60.0):
        self._current_version = current_version
        self._load = load
        self.poll_seconds = poll_seconds
        self.refused_retry_seconds = refused_retry_seconds
        self._refused: tuple[int, float] | None = None  # (version, retry not before)
        self.current: Served[M] | None = None
        self.last_error: str | None = None
        self.swaps = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one load at a time (poller vs an explicit refresh)
        self.polled = False  # the registry has been asked at least once
        self.registry_version: int | None = None  # what the alias named at the last successful poll
        self.registry_error: str | None = None  # why the last poll could not read the registry
        self.loading: int | None = None  # the version being loaded now
        self.failed: tuple[int, str] | None = None  # (version, "refused" | "load_failed") of the alias target

    def state(self) -> dict:
        """The served version, the registry's, and why they differ: `status` is "ok" only when
        they agree; else "registry_unreadable", "loading", "refused", "load_failed",
        "no_champion" (the registry names none) or "not_polled". Read without the lock: each
        field is one reference, and a poll in progress is reported as of its last write."""
        served = self.current.version if self.current is not None else None
        named = self.registry_version
        if not self.polled:
            status, reason = "not_polled", "the registry has not been read yet"
        elif self.registry_error is not None:
            status, reason = "registry_unreadable", self.registry_error
        elif named is None:
            status, reason = "no_champion", "the registry names no champion"
        elif served == named:
            status, reason = "ok", None
        elif self.loading == named:
            status, reason = "loading", f"loading version {named}"
        elif self.failed is not None and self.failed[0] == named:
            status, reason = self.failed[1], self.last_error
        else:
            status, reason = "loading", f"version {named} is named and not loaded yet"
        return {"status": status, "served_version": served, "registry_version": named,
                "registry_read": self.registry_error is None and self.polled, "reason": reason}

    def refresh(self) -> bool:
        """Load the alias target if it differs from the served version. True if swapped."""
        with self._lock:
            try:
                version = self._current_version()
            except Exception as exc:  # registry unreachable or unreadable: keep serving, and say so
                if self.registry_error is None:
                    log.warning("registry lookup failed: %s", exc)
                self.registry_error = f"registry lookup failed: {type(exc).__name__}: {exc}"
                self.polled = True
                return False
            if self.registry_error is not None:
                log.info("registry readable again")
            self.registry_version, self.registry_error, self.polled = version, None, True
            if version is None or (self.current is not None and self.current.version == version):
                return False
            if self._refused is not None and self._refused[0] == version and time.monotonic() < self._refused[1]:
                return False  # last_error still says why
            try:
                started = time.perf_counter()
                self.loading = version
                model = self._load(version)
            except ArtifactIntegrityError as exc:
                serving = self.current.version if self.current else None
                self.last_error = f"refused version {version}: {exc}; still serving {serving}"
                self._refused = (version, time.monotonic() + self.refused_retry_seconds)
                self.failed = (version, "refused")
                log.error(self.last_error)
                return False
            except Exception as exc:
                self.last_error = f"loading version {version} failed: {type(exc).__name__}: {exc}"
                self.failed = (version, "load_failed")
                log.exception("loading version %s failed; still serving %s", version,
                              self.current.version if self.current else None)
                return False
            finally:
                self.loading = None
            old = self.current.version if self.current else None
            self.current = Served(version, model, time.time())  # the swap: one reference assignment
            self.swaps += 1
            self.last_error = None
            self._refused = None
            self.failed = None
            log.info("serving version %s (was %s; loaded in %.2fs)", version, old, time.perf_counter() - started)
            return True

    def start(self) -> None:
        if self._thread is not None:
            return

        def loop() -> None:
            while not self._stop.wait(self.poll_seconds):
                self.refresh()

        self._thread = threading.Thread(target=loop, name="lattice-model-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
