"""`lattice serve CONFIG [--host 127.0.0.1 --port 8000]`: the champion model over HTTP."""

from __future__ import annotations

import argparse

from lattice.cli.common import load_or_exit


def _serve(args: argparse.Namespace) -> int:
    import torch
    import uvicorn

    from lattice.paths import Paths
    from lattice.serving.app import create_app

    config = load_or_exit(args.config)
    # small models on few cores: intra-op threads only add contention with the HTTP and lookup threads
    torch.set_num_threads(args.torch_threads)
    paths = Paths.for_config(config, args.workdir)
    app = create_app(config, paths, poll_seconds=args.poll_seconds)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
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
