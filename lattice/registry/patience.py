"""A registry that is locked or unreadable is never read as "absent".

MLflow's SQLite store waits up to 20 s on a lock inside each statement and then raises an
MlflowException that callers used to take for "no such alias". Here every client call that
meets a locked database is retried with a bounded backoff, and when the bound is spent the
error names the database file and the processes that hold it open. A file that is not an
SQLite database (0 bytes after a failed copy, a truncated or foreign file) is refused before
MLflow would quietly create a new empty registry in it.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

LOCK_WAIT_S = 5.0
"""How long one registry call keeps retrying a locked database before it reports the lock."""
_STATEMENT_BUSY_MS = 250
"""SQLite's own wait per statement, below MLflow's 20 s so that the bound above is what holds."""
_SQLITE_HEADER = b"SQLite format 3\x00"


class RegistryUnavailableError(RuntimeError):
    """The registry database exists but cannot be read now (locked past the bound) or at all
    (not an SQLite file). Never a reason to act as if there were no champion."""


def is_lock_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "database is locked" in text or "database table is locked" in text


def holders(db: Path) -> list[str]:
    """'pid (command)' of each process with `db` open, from /proc (empty where that is unreadable)."""
    out = []
    target = str(db.resolve())
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                    out.append(f"{pid} ({cmd[:80]})")
                    break
            except OSError:
                continue
    return out


def check_sqlite_file(db: Path) -> None:
    """Raise RegistryUnavailableError when `db` exists but is not an SQLite database."""
    if not db.exists():
        return
    try:
        with db.open("rb") as fh:
            head = fh.read(len(_SQLITE_HEADER))
    except OSError as exc:
        raise RegistryUnavailableError(f"the model registry database {db} cannot be read ({exc})") from None
    if head != _SQLITE_HEADER:
        what = "is empty (0 bytes)" if not head else "is not an SQLite database (truncated or replaced)"
        raise RegistryUnavailableError(
            f"the model registry database {db} {what}. Restore it from a backup (stop promote, rollback and serving "
            f"first); no new registry is created in its place, since versions would restart at 1 beside the old artifacts."
        )


def _sql_stores(client: Any) -> list[Any]:
    stores = []
    for get in (lambda: client._tracking_client.store, lambda: client._get_registry_client().store):
        try:
            stores.append(get())
        except Exception:  # an internal MLflow layout we do not know
            continue
    return stores


def dispose_engines(client: Any) -> None:
    """Close the pooled connections of this client's SQLAlchemy stores; the next statement opens
    the database file afresh (MLflow caches one store, and its engine, per URI)."""
    for store in _sql_stores(client):
        engine = getattr(store, "engine", None)
        if engine is not None:
            engine.dispose()


def shorten_sqlite_waits(client: Any) -> None:
    """Make SQLite's per-statement lock wait short for this client's stores, so a lock surfaces
    to `PatientClient`, whose bound applies (MLflow sets 20 s per statement). Stores that are
    not SQLAlchemy (a tracking server) are left alone."""
    from sqlalchemy import event

    for store in _sql_stores(client):  # an unknown layout keeps MLflow's own waits
        engine = getattr(store, "engine", None)
        if engine is None or engine.dialect.name != "sqlite" or getattr(engine, "_lattice_short_waits", False):
            continue

        def rewrite(conn, cursor, statement, parameters, context, executemany):
            if statement.lstrip().upper().startswith("PRAGMA BUSY_TIMEOUT"):
                statement = f"PRAGMA busy_timeout = {_STATEMENT_BUSY_MS};"
            return statement, parameters

        event.listen(engine, "before_cursor_execute", rewrite, retval=True)
        engine._lattice_short_waits = True


class PatientClient:
    """An MlflowClient whose calls retry a locked database (backoff 0.1 s doubling to 1 s) for
    up to `wait_s`, then raise RegistryUnavailableError naming `db` and its holders. A write
    that met the lock did not commit (SQLite rolls the statement back), so retrying it is safe."""

    def __init__(self, client: Any, db: Path | None, wait_s: float = LOCK_WAIT_S):
        self._client = client
        self._db = db
        self._wait_s = wait_s
        if db is not None:
            shorten_sqlite_waits(client)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr) or name.startswith("_"):
            return attr
        return self._patient(name, attr)

    def _patient(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            pause, tries = 0.1, 0
            while True:
                tries += 1
                try:
                    return call(*args, **kwargs)
                except Exception as exc:
                    if not is_lock_error(exc):
                        raise
                    waited = time.monotonic() - started
                    if waited + pause > self._wait_s:
                        where = f"the model registry database {self._db}" if self._db else "the model registry database"
                        held = holders(self._db) if self._db else []
                        raise RegistryUnavailableError(
                            f"{where} stayed locked for {waited:.1f} s ({tries} tries of {name}); nothing was read as "
                            f"missing and nothing was changed. Held open by: {', '.join(held) or 'unknown'}. Retry once "
                            f"that process (a promote, rollback, backup or sqlite3 shell) has finished."
                        ) from exc
                    log.info("registry %s: database locked, retrying in %.1f s", name, pause)
                    time.sleep(pause)
                    pause = min(pause * 2, 1.0)

        return run
