"""`lattice serve CONFIG [--host 127.0.0.1 --port 8000]`: the champion model over HTTP."""

from __future__ import annotations

import argparse
import copy
import sys

from lattice.cli.common import load_or_exit


def _log_config(level: str) -> dict:
    """uvicorn's logging, plus the server's own loggers: `lattice.serving.access` (one line per
    request, on stdout like uvicorn's access log) and the rest of `lattice.serving` (errors and
    tracebacks, on stderr), at `--log-level`."""
    from uvicorn.config import LOG_LEVELS, LOGGING_CONFIG

    cfg = copy.deepcopy(LOGGING_CONFIG)
    number = LOG_LEVELS.get(level.lower(), 20)  # uvicorn's names, `trace` included
    cfg["formatters"]["lattice"] = {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}
    cfg["handlers"]["lattice"] = {"class": "logging.StreamHandler", "formatter": "lattice", "stream": "ext://sys.stderr"}
    cfg["handlers"]["lattice_access"] = {"class": "logging.StreamHandler", "formatter": "lattice", "stream": "ext://sys.stdout"}
    cfg["loggers"]["lattice.serving"] = {"handlers": ["lattice"], "level": number, "propagate": False}
    cfg["loggers"]["lattice.serving.access"] = {"handlers": ["lattice_access"], "level": number, "propagate": False}
    return cfg


def _serve(args: argparse.Namespace) -> int:
    import torch
    import uvicorn

    from lattice.paths import Paths
    from lattice.serving.app import ServingStartupError, create_app

    config = load_or_exit(args.config)
    # small models on few cores: intra-op threads only add contention with the HTTP and lookup threads
    torch.set_num_threads(args.torch_threads)
    paths = Paths.for_config(config, args.workdir)
    try:
        app = create_app(config, paths, poll_seconds=args.poll_seconds)
    except ServingStartupError as exc:
        print(f"lattice serve: {exc}", file=sys.stderr)
        return 1
    # uvicorn's own access log stays off: the app writes its own (serving.access_log), which
    # also says the batch size and never logs a query string
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                log_config=_log_config(args.log_level))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the champion model: POST /predict, GET /healthz, GET /metadata")
    p.add_argument("config", help="platform config YAML, e.g. configs/demo.yaml")
    p.add_argument("--workdir", default=None, help="work directory (default: the config's workdir)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--poll-seconds", type=float, default=2.0, help="how often to check whether the champion alias moved")
    p.add_argument("--torch-threads", type=int, default=1, help="intra-op threads for the model (default 1)")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=_serve)
