"""`lattice serve CONFIG [--host 127.0.0.1 --port 8000] [--workers N]`: the champion model over HTTP."""

from __future__ import annotations

import argparse
import copy
import os
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


def is_loopback(host: str) -> bool:
    """True when `host` binds only this machine (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve beyond this machine


def exposure_error(host: str, token_env: str | None, insecure: bool) -> str | None:
    """Why the server must not start: bound beyond loopback with no token, unless the user said
    `--insecure` (anyone who can reach the port could then score and read model metadata)."""
    if is_loopback(host) or token_env or insecure:
        return None
    return (f"--host {host} listens beyond this machine, and no token is configured: set serving.auth_token_env "
            "in the config to the name of an environment variable holding a token (clients then send "
            "Authorization: Bearer <token>), bind --host 127.0.0.1, or pass --insecure to serve without "
            "authentication on purpose")


def _serve(args: argparse.Namespace) -> int:
    from lattice.deploy.profile import ProfileError, services
    from lattice.serving.app import ServingStartupError, _auth_token

    config = load_or_exit(args.config)
    refused = exposure_error(args.host, config.serving.auth_token_env, args.insecure)
    if refused:
        print(f"lattice serve: {refused}", file=sys.stderr)
        return 1
    if args.insecure and not config.serving.auth_token_env and not is_loopback(args.host):
        import logging

        logging.getLogger("lattice.serving").warning(
            "serving on %s WITHOUT authentication (--insecure): anyone who reaches port %s can call /predict",
            args.host, args.port)
        print(f"lattice serve: WARNING: --insecure: {args.host}:{args.port} answers without authentication", file=sys.stderr)
    try:
        svc = services(config)
        workers = args.workers or svc.serving_workers
        _auth_token(config.serving.auth_token_env)  # refuse here, not in every worker
    except (ServingStartupError, ProfileError) as exc:
        print(f"lattice serve: {exc}", file=sys.stderr)
        return 1
    # uvicorn's own access log stays off: the app writes its own (serving.access_log), which
    # also says the batch size and never logs a query string
    # an idle keep-alive connection is closed after serving.limits.keep_alive_seconds, one slow
    # to send its headers after header_timeout_seconds (our protocol: uvicorn has no such bound;
    # the environment carries it to every worker), a slow body by the app's BodyTimeout
    from lattice.serving.header_timeout import HEADER_TIMEOUT_ENV, IMPORT_STRING

    os.environ[HEADER_TIMEOUT_ENV] = str(config.serving.limits.header_timeout_seconds)
    common = dict(host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                  log_config=_log_config(args.log_level), timeout_keep_alive=config.serving.limits.keep_alive_seconds,
                  http=IMPORT_STRING)
    target = _announce(config, args, svc.prometheus_targets_dir)
    try:
        return _run(args, config, workers, common)
    finally:
        if target is not None:
            from lattice.serving.scrape_target import unregister

            unregister(target)


def _announce(config, args: argparse.Namespace, targets: str | None):
    """Under a profile with Prometheus, this server's scrape target (file_sd); else None."""
    from lattice.serving.scrape_target import register

    if not targets or not config.monitoring.metrics:
        return None
    return register(targets, args.host, args.port, {"config": os.path.basename(args.config)})


def _run(args: argparse.Namespace, config, workers: int, common: dict) -> int:
    import uvicorn

    from lattice.paths import Paths
    from lattice.serving.app import ServingStartupError, create_app
    from lattice.serving.worker import spec_env

    if workers > 1:
        # each worker process imports the factory and builds its own server from this spec
        os.environ.update(spec_env(os.path.abspath(args.config), args.workdir, args.poll_seconds, args.torch_threads,
                                   args.replay_clock))
        # /metrics sums every worker's values from files in one folder (prometheus-client's
        # multiprocess mode); a fresh folder per start, so a previous run's counts never add in
        # (our own folder even when an import of Feast already set one of its own)
        import tempfile

        from lattice.serving.metrics import LATTICE_MULTIPROC_ENV

        folder = tempfile.mkdtemp(prefix="lattice-metrics-")
        os.environ.update({"PROMETHEUS_MULTIPROC_DIR": folder, "PROMETHEUS_MULTIPROCESS_DIR": folder,
                           LATTICE_MULTIPROC_ENV: "1"})
        uvicorn.run("lattice.serving.worker:app", factory=True, workers=workers, **common)
        return 0
    import torch

    # small models on few cores: intra-op threads only add contention with the HTTP and lookup threads
    torch.set_num_threads(args.torch_threads)
    paths = Paths.for_config(config, args.workdir)
    try:
        app = create_app(config, paths, poll_seconds=args.poll_seconds, replay_clock=args.replay_clock)
    except ServingStartupError as exc:
        print(f"lattice serve: {exc}", file=sys.stderr)
        return 1
    uvicorn.run(app, **common)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the champion model: POST /predict, GET /healthz, GET /metadata, GET /metrics")
    p.add_argument("config", help="platform config YAML, e.g. configs/demo.yaml")
    p.add_argument("--workdir", default=None, help="work directory (default: the config's workdir)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1); beyond loopback a token (serving.auth_token_env) or --insecure is required")
    p.add_argument("--insecure", action="store_true",
                   help="allow a --host beyond loopback without a token (logged as a warning)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--poll-seconds", type=float, default=2.0, help="how often to check whether the champion alias moved")
    p.add_argument("--replay-clock", action="store_true",
                   help="replays of past traffic (backtests): a /predict request may set the time its rows are logged at "
                        "with the header X-Lattice-Logged-At (ISO 8601 or epoch seconds); refused with 400 otherwise")
    p.add_argument("--torch-threads", type=int, default=1, help="intra-op threads for the model (default 1)")
    p.add_argument("--workers", type=int, default=None,
                   help="uvicorn worker processes sharing the port (default: the scale-out profile's serving.workers, else 1)")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=_serve)
