"""Feast notices the platform silences where it calls the API that raises them (its own module:
both the repo writer and the store use it, and neither should import the other for it)."""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterator

# Feast's Spark offline store and SparkSource warn (RuntimeWarning) on every first use that they
# are "an experimental feature in alpha development". The platform chose them knowingly (the
# choice is in the config's feature_store.offline_store), so the notice tells a user nothing, and
# printed by the warnings module it left a stray "  warnings.warn(" source line in `lattice demo`.
EXPERIMENTAL = r"The spark (offline store|data source API) is an experimental feature"


@contextlib.contextmanager
def feast_experimental() -> Iterator[None]:
    """Around a call into Feast's Spark offline store or SparkSource: its 'experimental' notice is
    dropped, every other warning (Feast's included) still shows. A context, not a global filter,
    because Feast's own import re-inserts `simplefilter("once", RuntimeWarning)` ahead of any rule
    installed before it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=EXPERIMENTAL, category=RuntimeWarning)
        yield
