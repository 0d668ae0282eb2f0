"""The MLflow tracking server of the scale-out profile: runs and the model registry in PostgreSQL
(database `lattice_mlflow`), artifacts proxied by the server into one shared folder.

The backend URI carries the database password, so it goes to `mlflow server` through its
environment variable (MLFLOW_BACKEND_STORE_URI), never on the command line, which `ps` shows.
"""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

from lattice.deploy import processes as P
from lattice.deploy.local_services import DATABASES, PG_USER, Layout, ServiceError, credentials


def artifacts_dir(layout: Layout) -> Path:
    return layout.home / "mlflow-artifacts"


def tracking_uri(layout: Layout) -> str:
    return f"http://127.0.0.1:{layout.ports['mlflow']}"


def _pidfile(layout: Layout) -> Path:
    return layout.home / "mlflow" / "server.pid"


def start_mlflow(layout: Layout) -> None:
    if P.running(_pidfile(layout)) and mlflow_ready(layout):
        return
    P.stop(_pidfile(layout))  # a server that lost its port or hangs: start it again
    artifacts_dir(layout).mkdir(parents=True, exist_ok=True)
    backend = (f"postgresql+psycopg2://{PG_USER}:{credentials(layout)['postgres']}@127.0.0.1:{layout.ports['postgres']}"
               f"/{DATABASES['mlflow']}")
    env = P.base_env(MLFLOW_BACKEND_STORE_URI=backend, MLFLOW_ARTIFACTS_DESTINATION=artifacts_dir(layout).as_uri())
    mlflow = Path(sys.executable).with_name("mlflow")
    # one worker: the server is an index over PostgreSQL and a file proxy, and this machine has 2 cores
    P.start([str(mlflow), "server", "--host", "127.0.0.1", "--port", str(layout.ports["mlflow"]), "--workers", "1",
             "--serve-artifacts"], _pidfile(layout), layout.logs / "mlflow.log", env, layout.home / "mlflow")
    # the first start runs the schema migrations on PostgreSQL (tens of seconds)
    if not P.wait_until(lambda: mlflow_ready(layout) or not P.running(_pidfile(layout)), 180, interval=1.0) \
            or not mlflow_ready(layout):
        raise ServiceError(f"the MLflow server did not answer within 180 s or exited; see {layout.logs / 'mlflow.log'}")


def mlflow_ready(layout: Layout) -> bool:
    try:
        with urllib.request.urlopen(tracking_uri(layout) + "/health", timeout=2) as r:
            return r.status == 200
    except Exception:
        return False


def stop_mlflow(layout: Layout) -> None:
    P.stop(_pidfile(layout))
