"""Let apache-airflow-providers-celery 3.26 import under celery 5.7.

The provider imports `retry` from `celery.backends.database`; celery 5.7 removed that decorator
(its backend now retries on its own), so `airflow celery worker` and the scheduler's
CeleryExecutor fail at import. `install()` puts a small equivalent back before the provider is
imported; the scale-out Airflow calls it from its `airflow_local_settings.py`. Drop this module
once the provider and celery agree again.
"""

from __future__ import annotations

import functools
import logging
import time

log = logging.getLogger(__name__)
ATTEMPTS = 5


def _retry(fn):
    """Retry a result-backend query a few times on a database error (a PostgreSQL restart)."""
    from sqlalchemy.exc import DatabaseError, InterfaceError

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return fn(*args, **kwargs)
            except (DatabaseError, InterfaceError) as exc:
                if attempt == ATTEMPTS:
                    raise
                log.warning("result backend query failed (%s); retry %d of %d", type(exc).__name__, attempt, ATTEMPTS - 1)
                time.sleep(min(2 ** attempt, 10))

    return wrapper


def install() -> None:
    import celery.backends.database as db

    if not hasattr(db, "retry"):
        db.retry = _retry
