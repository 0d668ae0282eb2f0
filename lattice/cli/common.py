"""Helpers shared by CLI commands."""

from __future__ import annotations

import sys

from lattice.config import ConfigError, PlatformConfig, load_config
from lattice.paths import Paths


def load_or_exit(path: str, overrides: list[str] | None = None) -> PlatformConfig:
    """Load a config (with `--set KEY=VALUE` overrides) or print every problem and exit 1
    (commands never start on a bad config)."""
    try:
        return load_config(path, overrides)
    except ConfigError as exc:
        for p in exc.problems:
            print(p.render(exc.file), file=sys.stderr)
        raise SystemExit(1) from None


def add_set_argument(p) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="change one config value for this run (repeatable), e.g. --set training.epochs=1 "
                        "--set models.teacher.experts=8 --set objectives.conversion.given=click")


def config_and_paths(args, *, ensure: bool = False) -> tuple[PlatformConfig, Paths]:
    """The config of `args.config` (with its `--set` overrides, if the command takes them) and the
    work paths of `args.workdir`; `ensure` creates the work folders."""
    config = load_or_exit(args.config, getattr(args, "overrides", None))
    paths = Paths.for_config(config, args.workdir)
    return config, paths.ensure() if ensure else paths
