"""A Spark standalone cluster on loopback: one master and two workers of 1 core each, run from the
Spark distribution that ships inside the installed pyspark (its `bin/spark-class`).

We call spark-class directly instead of `sbin/start-*.sh` (the pip package ships no start scripts
for master and worker): each daemon is then our own detached child with a pid file, its log in
`<home>/logs/`, and `down` can stop exactly what it started. SPARK_LOCAL_IP=127.0.0.1 keeps the
RPC ports, the executors and the web UIs on loopback.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

from lattice.deploy import processes as P
from lattice.deploy.local_services import Layout, ServiceError

WORKERS = 2
WORKER_CORES = 1
# what each worker offers, and the heap the platform's drivers ask per executor on this cluster
# (pipelines/spark.py): one executor per worker. 3g x 2 next to a 4g driver fits this 24 GiB box;
# at 1g (Spark's default) a 10M-row consolidation ran out of executor heap.
WORKER_MEMORY = "3g"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    import pyspark

    home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-class").exists():
        raise ServiceError(f"{home} has no bin/spark-class: reinstall pyspark (a `pyspark-client` install "
                           f"overwrites the full distribution)")
    return home


def master_url(layout: Layout) -> str:
    return f"spark://127.0.0.1:{layout.ports['spark']}"


def _dir(layout: Layout) -> Path:
    return layout.home / "spark"


def _pidfile(layout: Layout, name: str) -> Path:
    return _dir(layout) / f"{name}.pid"


def _worker_port(layout: Layout, i: int) -> int:
    return layout.ports["spark_worker"] if i == 1 else layout.ports["spark_worker2"]


def _env(layout: Layout) -> dict[str, str]:
    d = _dir(layout)
    conf = d / "conf"  # an empty conf folder: no spark-defaults / spark-env from elsewhere apply
    conf.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parents[2]
    return P.base_env(SPARK_HOME=str(spark_home()), SPARK_CONF_DIR=str(conf), SPARK_LOCAL_IP="127.0.0.1",
                      SPARK_LOCAL_DIRS=str(d / "local"), SPARK_NO_DAEMONIZE="1",
                      # no REST submission server: it would take the fixed port 6066 (two clusters
                      # on one machine collide) and jobs here are submitted by their drivers
                      SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
                      # executors run the platform's Python (pyarrow, lattice on the path)
                      PYSPARK_PYTHON=sys.executable, PYTHONPATH=str(repo))


def _cmd(cls: str, *args: str) -> list[str]:
    return [str(spark_home() / "bin" / "spark-class"), cls, *args]


def start_master(layout: Layout) -> None:
    pid = _pidfile(layout, "master")
    if P.running(pid):
        return
    P.start(_cmd(MASTER_CLASS, "--host", "127.0.0.1", "--port", str(layout.ports["spark"]),
                 "--webui-port", str(layout.ports["spark_ui"])),
            pid, layout.logs / "spark-master.log", _env(layout), _dir(layout))
    if not P.wait_until(lambda: _master_state(layout) is not None, 120):
        raise ServiceError(f"the Spark master did not answer within 120 s; see {layout.logs / 'spark-master.log'}")


def start_worker(layout: Layout, i: int, memory: str = WORKER_MEMORY) -> None:
    pid = _pidfile(layout, f"worker{i}")
    if P.running(pid):
        return
    work = _dir(layout) / f"work{i}"
    P.start(_cmd(WORKER_CLASS, "--host", "127.0.0.1", "--port", str(_worker_port(layout, i)), "--webui-port", "0",
                 "--cores", str(WORKER_CORES), "--memory", memory, "--work-dir", str(work), master_url(layout)),
            pid, layout.logs / f"spark-worker{i}.log", _env(layout), _dir(layout))


def start_spark(layout: Layout) -> None:
    start_master(layout)
    for i in range(1, WORKERS + 1):
        start_worker(layout, i)
    if not P.wait_until(lambda: alive_workers(layout) >= WORKERS, 180):
        raise ServiceError(f"{alive_workers(layout)} of {WORKERS} Spark workers registered within 180 s (a loaded machine is slow to start JVMs); "
                           f"see {layout.logs}/spark-worker*.log")


def _master_state(layout: Layout) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{layout.ports['spark_ui']}/json/", timeout=2) as r:
            return json.load(r)
    except Exception:
        return None


def alive_workers(layout: Layout) -> int:
    state = _master_state(layout) or {}
    return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")


def active_apps(layout: Layout) -> list[dict]:
    return (_master_state(layout) or {}).get("activeapps", [])


def spark_ready(layout: Layout) -> bool:
    return alive_workers(layout) >= WORKERS


def kill_worker(layout: Layout, i: int) -> None:
    """SIGKILL worker `i` and its executors together: one node of the cluster lost."""
    P.kill(_pidfile(layout, f"worker{i}"))


def stop_spark(layout: Layout) -> None:
    # workers first: a master stopping first makes them retry (and log) until they are stopped
    for i in range(1, WORKERS + 1):
        P.stop(_pidfile(layout, f"worker{i}"))
    P.stop(_pidfile(layout, "master"))
