"""Parse a user's file or folder for batch scoring with a source's own mapping and the same
Spark SQL as the feature stage (`pipelines.ingest`), so a scored row is encoded exactly like a
training row. Rows that cannot be parsed are returned with their reason, never dropped.

Labels are not read (a table to score has none); ids, splits and duplicates do not apply."""

from __future__ import annotations

from lattice.config import PlatformConfig
from lattice.config.schema import Source
from lattice.data import schema as S

from pipelines import ingest, sources
from pipelines.spark import get_spark


class InputError(ValueError):
    """The input cannot be scored as given (no file, no matching source)."""


def input_files(path: str, source: Source) -> list[str]:
    files = sources.matching_files(path, source.format)
    if not files:
        raise InputError(f"no {source.format} file at {path}")
    return files


def pick_source(config: PlatformConfig, path: str, name: str | None) -> Source:
    """The named source, or the one source whose format fits and whose columns the file has."""
    if name is not None:
        found = next((s for s in config.sources if s.name == name), None)
        if found is None:
            raise InputError(f"unknown source {name!r}; the config has {[s.name for s in config.sources]}")
        return found
    fits = []
    for s in config.sources:
        try:
            files = input_files(path, s)
            cols = sources.file_columns(s, files[0])
        except (InputError, OSError, ValueError):
            continue
        if all(c in cols for c in scoring_source(s).columns):
            fits.append(s)
    if len(fits) != 1:
        raise InputError(f"{'no' if not fits else 'more than one'} source of the config fits {path} "
                         f"({[s.name for s in fits] or [s.name for s in config.sources]}); pass --source NAME")
    return fits[0]


def scoring_source(source: Source) -> Source:
    """The source without labels, truth or key: what is left is the mapping of the features."""
    return source.model_copy(update={"labels": {}, "truth": {}, "key": [], "split": None})


def scoring_config(config: PlatformConfig, source: Source) -> PlatformConfig:
    # the split is a training matter; kind hash reads no column a scoring table may lack
    training = config.training.model_copy(update={"split": config.training.split.model_copy(update={"kind": "hash"})})
    return config.model_copy(update={"sources": [source], "training": training})


def parse_input(config: PlatformConfig, path: str, source_name: str | None = None, master: str | None = None):
    """-> (good rows as pandas in the consolidated layout + pass-through, quarantined rows as
    pandas with reason / detail / raw / file, the source used)."""
    from pyspark.sql import functions as F

    src = pick_source(config, path, source_name)
    scoring = scoring_source(src)
    files = input_files(path, scoring)
    cols = sources.source_columns(scoring, files)
    spark = get_spark(master, config=config)
    cfg = scoring_config(config, scoring)
    tagged = ingest.tag(cfg, ingest.read_raw(spark, scoring, files, cols)).cache()
    keep = [c for c in S.consolidated_columns(cfg) if not c.startswith(("label_", "mask_", "truth_", "known_")) and c != "split"]
    good = tagged.where(F.col("_reason").isNull()).select(*keep).toPandas()
    bad = tagged.where(F.col("_reason").isNotNull()).select(
        F.col("_reason").alias("reason"), F.col("_detail").alias("detail"), F.col("_raw").alias("raw"),
        F.col("_file").alias("file"), *[F.col(c) for c in S.passthrough_columns(cfg)]).toPandas()
    tagged.unpersist()
    return good, bad, src
