"""One SparkSession per process, configured the same way for tests, the CLI and spark-submit."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_MASTER = "local[2]"

# Settings every job relies on; re-applied at runtime to a session someone else started.
RUNTIME_CONF = {
    "spark.sql.session.timeZone": "UTC",
    # re-running a date replaces its (date, domain) partitions and nothing else
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
    # Feast / pyarrow readers and Spark itself agree on microseconds (Spark's default is INT96)
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # malformed-line detection must not depend on which columns a query happens to read
    "spark.sql.csv.parser.columnPruning.enabled": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # a bad value in a config expression (domain / label `expr`) becomes null -> quarantined,
    # instead of failing the whole job as ANSI casts would
    "spark.sql.ansi.enabled": "false",
}


LOG4J2 = Path(__file__).with_name("log4j2.properties")


def driver_conf(master: str) -> dict[str, str]:
    """Settings of the driver JVM itself, for every session the platform starts (ours and Feast's):
    no console progress bar (its `\r` lines fill a task log), the platform's log4j2 file (JVM
    warnings on stdout, errors alone on stderr), and, for a master on loopback, a driver that
    listens on loopback only (no port on the machine's network). A remote cluster master needs a
    reachable driver, which its environment names (LATTICE_SPARK_DRIVER_HOST / SPARK_LOCAL_IP)."""
    conf = {"spark.ui.showConsoleProgress": "false",
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J2.as_uri()}"}
    host = os.environ.get("LATTICE_SPARK_DRIVER_HOST", "127.0.0.1" if _loopback(master) else "")
    if host:
        conf.update({"spark.driver.host": host, "spark.driver.bindAddress": host})
    return conf


def resolve_master(master: str | None = None, config=None) -> str:
    """The master a job runs on: an explicit `master` (`--master`), else LATTICE_SPARK_MASTER,
    else the scale-out profile's Spark master when `config` runs in that profile, else local[2]."""
    if master:
        return master
    if os.environ.get("LATTICE_SPARK_MASTER"):
        return os.environ["LATTICE_SPARK_MASTER"]
    if config is not None and config.deployment.profile != "embedded":
        from lattice.deploy.profile import services

        return services(config).spark_master
    return DEFAULT_MASTER


def _loopback(master: str) -> bool:
    """local[*], or a cluster master on this machine's loopback (the scale-out profile here)."""
    if master.startswith("local"):
        return True
    host = urlsplit(master).hostname or ""
    return host in ("127.0.0.1", "localhost", "::1")


def _executor_memory(master: str) -> str | None:
    """The heap of each executor on a cluster master: LATTICE_SPARK_EXECUTOR_MEMORY, else, for the
    loopback cluster of the scale-out profile, what its workers offer (Spark's own default of 1g
    ran out of heap consolidating 10M rows, relaunching executors that lost their shuffle files),
    else the cluster's own spark-defaults. local[*] runs in the driver's heap and needs none."""
    if master.startswith("local"):
        return None
    if os.environ.get("LATTICE_SPARK_EXECUTOR_MEMORY"):
        return os.environ["LATTICE_SPARK_EXECUTOR_MEMORY"]
    if _loopback(master):
        from lattice.deploy.spark_cluster import WORKER_MEMORY

        return WORKER_MEMORY
    return None


def get_spark(master: str | None = None, app_name: str = "lattice-features", shuffle_partitions: int | None = None,
              config=None):
    """The active session if there is one (tests share a single session), else a new one on
    `resolve_master(master, config)` with the UI off and few shuffle partitions."""
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        parts = shuffle_partitions or int(os.environ.get("LATTICE_SHUFFLE_PARTITIONS", "8"))
        master = resolve_master(master, config)
        conf = driver_conf(master)
        if "spark.driver.host" in conf:  # the JVM's own interface lookup agrees with the bind address
            os.environ.setdefault("SPARK_LOCAL_IP", conf["spark.driver.host"])
        options = {
            "spark.master": master,
            "spark.app.name": app_name,
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": str(parts),
            "spark.default.parallelism": str(parts),
            "spark.driver.memory": os.environ.get("LATTICE_SPARK_MEMORY", "4g"),
            "spark.sql.adaptive.enabled": "true",
            **conf,
            **RUNTIME_CONF,
        }
        executor_memory = _executor_memory(master)
        if executor_memory:
            options["spark.executor.memory"] = executor_memory
        from pyspark import SparkConf

        from pipelines.jvm_log import launch_relayed

        launch_relayed(SparkConf().setAll(list(options.items())))  # off a terminal: JVM lines by level
        builder = SparkSession.builder
        for k, v in options.items():
            builder = builder.config(k, v)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
    for k, v in RUNTIME_CONF.items():
        spark.conf.set(k, v)
    return spark
