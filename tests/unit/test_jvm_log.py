"""pipelines.jvm_log: each line of the Spark driver JVM's output at the level it names."""

from __future__ import annotations

import logging

from pipelines.jvm_log import levels


def test_log4j_prefixes_name_the_level_and_a_trace_follows_its_record():
    out = list(levels([
        "WARN SparkContext: a warning",
        "ERROR Executor: Exception in task 0.0",
        "java.lang.IllegalStateException: boom",
        "\tat org.apache.spark.Foo.bar(Foo.scala:1)",
        "Caused by: java.io.IOException: disk",
        "\t... 12 more",
        "INFO Something: back to normal",
        "an unprefixed line",
    ], logging.WARNING))
    assert [lvl for lvl, _ in out] == [logging.WARNING, logging.ERROR, logging.ERROR, logging.ERROR, logging.ERROR,
                                       logging.ERROR, logging.INFO, logging.WARNING]


def test_progress_bar_returns_split_lines_and_the_launcher_note_is_debug():
    out = list(levels(["[Stage 0:>   (0 + 2) / 2]\r[Stage 0:=====>   (1 + 1) / 2]\r\r",
                       "WARNING: Using incubator modules: jdk.incubator.vector"], logging.INFO))
    assert out == [(logging.INFO, "[Stage 0:>   (0 + 2) / 2]"), (logging.INFO, "[Stage 0:=====>   (1 + 1) / 2]"),
                   (logging.DEBUG, "WARNING: Using incubator modules: jdk.incubator.vector")]


def test_an_unprefixed_line_after_an_error_is_not_an_error():
    out = list(levels(["ERROR X: failed", "plain text"], logging.WARNING))
    assert out[1] == (logging.WARNING, "plain text")


def test_nothing_is_launched_under_spark_submit_or_on_a_terminal(monkeypatch):
    import io

    import pipelines.jvm_log as jvm_log

    monkeypatch.setattr("pyspark.java_gateway.launch_gateway", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    monkeypatch.setattr("pyspark.SparkContext._gateway", None)  # as in a process with no JVM yet
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "12345")  # spark-submit's own JVM serves this process
    monkeypatch.setattr(jvm_log.sys, "stderr", io.StringIO())
    assert jvm_log.launch_relayed(None) is False
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT")

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(jvm_log.sys, "stderr", Tty())
    assert jvm_log.launch_relayed(None) is False
