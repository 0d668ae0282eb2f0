"""Helpers shared by CLI commands."""

from __future__ import annotations

import sys

from lattice.config import ConfigError, PlatformConfig, load_config


def load_or_exit(path: str) -> PlatformConfig:
    """Load a config or print every problem and exit 1 (commands never start on a bad config)."""
    try:
        return load_config(path)
    except ConfigError as exc:
        for p in exc.problems:
            print(p.render(exc.file), file=sys.stderr)
        raise SystemExit(1) from None
