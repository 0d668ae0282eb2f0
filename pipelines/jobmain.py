"""The shared `__main__` of every job: `spark-submit pipelines/<job>.py --config FILE [--master M]
[--workdir DIR] [--start DATE --end DATE] [--domains a,b]` runs the job and prints its summary."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable


def ensure_importable() -> None:
    """spark-submit puts the script's folder on sys.path, not the repository root."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)


def main(job: Callable[..., dict], description: str, window: bool = True, argv: list[str] | None = None) -> int:
    ensure_importable()
    from lattice.config import ConfigError, load_config
    from lattice.paths import Paths

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--config", required=True, help="platform config YAML")
    p.add_argument("--master", default=None, help="Spark master (default: the scale-out profile's master if deployment.profile is scale-out, else local[2])")
    p.add_argument("--workdir", default=None, help="work directory (default: the config's workdir)")
    if window:
        p.add_argument("--start", default=None, help="first date to process, yyyy-MM-dd (default: the config's time_range)")
        p.add_argument("--end", default=None, help="day after the last date to process (exclusive)")
        p.add_argument("--domains", default=None, help="comma-separated domains (default: all)")
    args = p.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    paths = Paths.for_config(config, args.workdir).ensure()
    kwargs = {"master": args.master}
    if window:
        kwargs.update(start=args.start, end=args.end, domains=args.domains.split(",") if args.domains else None)
    out = job(config, paths, **kwargs)
    print(json.dumps(out, indent=2, default=str))
    return 0
