"""Spark jobs of the feature pipeline (ingest -> validate -> consolidate -> aggregates) and the
Feast stages that follow them. Every job is a plain function `job(config, paths, ...) -> dict`
and also a `spark-submit pipelines/<job>.py --config FILE` script."""
