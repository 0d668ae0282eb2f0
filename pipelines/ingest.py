"""Read one raw source with Spark and turn every raw row into a row of the consolidated schema
plus a `_reason` (null for a good row). Nothing is dropped here: malformed lines, unparseable or
out-of-range times, unknown domains, null keys and bad labels all keep their raw text and get a
reason, so that rows in = rows out + rows quarantined.

All parsing is Spark SQL (no Python UDFs), so a job runs the same on any master."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from lattice.config import PlatformConfig
from lattice.config.schema import Source
from lattice.config.timing import attribution_window, known_at_objectives
from lattice.data import schema as S

CORRUPT = "_corrupt_record"
SEP = {"csv": ",", "tsv": "\t"}

# reason codes (the quarantine's `reason` column); the first failing check wins
MALFORMED = "malformed_line"
BAD_TIMESTAMP = "bad_timestamp"
OUT_OF_RANGE = "timestamp_out_of_range"
UNKNOWN_DOMAIN = "unknown_domain"
NULL_KEY = "null_key"
NULL_LABEL = "null_label"
BAD_LABEL = "bad_label"
BAD_VALUE = "bad_value"
VALUE_OUT_OF_RANGE = "value_out_of_range"
BAD_ID = "bad_id"
BAD_SPLIT = "bad_split"
DUPLICATE = "duplicate_key"
LABEL_TIME_MISSING = "label_time_missing"
LABEL_BEFORE_EVENT = "label_before_event"
REASONS = [MALFORMED, BAD_TIMESTAMP, OUT_OF_RANGE, UNKNOWN_DOMAIN, NULL_KEY, NULL_LABEL, BAD_LABEL, BAD_VALUE,
           VALUE_OUT_OF_RANGE, BAD_ID, BAD_SPLIT, DUPLICATE, LABEL_TIME_MISSING, LABEL_BEFORE_EVENT]
# text that means "no value" in exported logs: an id, not a null, if hashed
NULL_LIKE = S.NULL_LIKE


def q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def null_like_sql(v: str) -> str:
    """True where the text is empty or a spelling of "no value" ('null', 'NULL', 'None', 'NaN', ...)."""
    words = ", ".join(_sql_str(w) for w in NULL_LIKE)
    return f"({v} IS NULL OR trim({v}) = '' OR lower(trim({v})) IN ({words}))"


def non_scalar_sql(v: str) -> str:
    """A JSON array or object where one value belongs (a jsonl field read as text)."""
    return f"(ltrim({v}) LIKE '[%' OR ltrim({v}) LIKE '{{%')"


def stable_id_sql(v: str) -> str:
    """Spark twin of `lattice.data.schema.stable_id` (empty or null-like -> null: a missing value, not an id)."""
    return (
        f"CASE WHEN {null_like_sql(v)} THEN NULL "
        f"WHEN {v} RLIKE '^[+-]?[0-9]+$' AND try_cast({v} AS BIGINT) IS NOT NULL THEN try_cast({v} AS BIGINT) "
        f"ELSE CAST(conv(substr(md5({v}), 1, 15), 16, 10) AS BIGINT) END"
    )


def event_time_sql(source: Source, column: str | None = None) -> str:
    """The event time as a Spark timestamp; `column` reads another raw column in the same format
    (a label's `known_at`)."""
    et = source.event_time
    if et.format == "constant":
        value = et.value if et.value.tzinfo is None else et.value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return f"TIMESTAMP '{value:%Y-%m-%d %H:%M:%S.%f}'"
    v = q(column or et.column)
    if et.format in ("unix_seconds", "unix_millis"):
        scale = 1_000_000 if et.format == "unix_seconds" else 1_000
        d = f"try_cast({v} AS DOUBLE)"
        # guard the range so absurd values become a bad timestamp instead of an overflow
        return (f"CASE WHEN {d} IS NULL OR abs({d}) * {scale} > 9.0E15 OR isnan({d}) THEN NULL "
                f"ELSE timestamp_micros(CAST(round({d} * {scale}) AS BIGINT)) END")
    if et.format == "iso":
        return f"try_cast({v} AS TIMESTAMP)"
    pattern = et.format.replace("\\", "\\\\").replace("'", "\\'")  # any Spark datetime pattern, as a SQL literal
    return f"try_to_timestamp(CAST({v} AS STRING), '{pattern}')"


def canonical_sql(source: Source) -> dict[str, str]:
    """Canonical column -> a Spark SQL expression of its raw text: a renamed raw column, or the
    source's own expression cast to text (so both are parsed by the same rules below)."""
    out: dict[str, str] = {}
    for raw_name, canon in source.columns.items():
        out.setdefault(canon, q(raw_name))
    for canon, expr in source.expressions.items():
        out[canon] = f"CAST(({expr}) AS STRING)"
    return out


def example_id_sql(source: Source, columns: list[str]) -> str:
    """A declared key hashes the key columns; without one, every raw cell is hashed, and the
    consolidate stage gives each further identical copy of a row an id of its own (`occurrence_id_sql`)."""
    cells = ", ".join(f"coalesce(CAST({q(c)} AS STRING), '')" for c in (source.key or columns))
    # 'key' in the hash: a key of one column never collides with a one-column row of that value
    prefix = f"'{source.name}', 'key'" if source.key else f"'{source.name}'"
    return f"substr(sha1(concat_ws('\\u001f', {prefix}, {cells})), 1, 20)"


def occurrence_id_sql(id_col: str, occurrence_col: str) -> str:
    """The n-th identical copy of a raw row (n > 1) is a distinct event with a distinct id; the
    first keeps the row's hash, so a log without repeats keeps the ids it always had."""
    return (f"CASE WHEN {occurrence_col} <= 1 THEN {id_col} "
            f"ELSE substr(sha1(concat({id_col}, '#', CAST({occurrence_col} AS STRING))), 1, 20) END")


def split_sql(config: PlatformConfig, source: Source) -> str:
    """The row's split where it comes from the data (time, column, source); kind `hash` is
    decided from the final example id in the consolidate stage (NULL here)."""
    sp = config.training.split
    if sp.kind == "time":
        return (f"CASE WHEN __event_timestamp IS NULL THEN NULL "
                f"WHEN __event_timestamp >= TIMESTAMP '{sp.test_start:%Y-%m-%d %H:%M:%S}' THEN 'test' "
                f"WHEN __event_timestamp >= TIMESTAMP '{sp.validation_start:%Y-%m-%d %H:%M:%S}' THEN 'validation' ELSE 'train' END")
    if sp.kind == "column":
        v = f"trim(CAST({q(sp.column)} AS STRING))"
        whens = " ".join(f"WHEN {v} IN ({', '.join(_sql_str(x) for x in vals)}) THEN '{name}'" for name, vals in sp.values.items() if vals)
        return f"CASE {whens} ELSE NULL END"
    if sp.kind == "source":
        return f"'{source.split}'"
    return "CAST(NULL AS STRING)"


def _sql_str(value: str) -> str:
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def domain_sql(source: Source) -> str:
    if isinstance(source.domain, str):
        return f"'{source.domain}'"
    spec = source.domain
    raw = q(spec.column) if spec.column else f"({spec.expr})"
    pairs = ", ".join(f"'{k}', '{v}'" for k, v in spec.map.items())
    # a value not in the map is null -> the default, or an unknown domain (quarantined)
    mapped = f"CASE WHEN {raw} IS NULL THEN NULL ELSE try_element_at(map({pairs}), CAST({raw} AS STRING)) END"
    return f"coalesce({mapped}, '{spec.default}')" if spec.default else mapped


def domain_value_sql(source: Source) -> str:
    """The raw value the domain is read from (for the quarantine detail)."""
    if isinstance(source.domain, str):
        return "NULL"
    return f"CAST({q(source.domain.column) if source.domain.column else '(' + source.domain.expr + ')'} AS STRING)"


def _cat(prefix: str, col):
    from pyspark.sql import functions as F

    return F.concat(F.lit(prefix), F.coalesce(col.cast("string"), F.lit("null")))


def label_sql(spec) -> str:
    """Label as a double (0/1 expected; anything else is a bad label, null a null label)."""
    if spec.column:
        return f"try_cast({q(spec.column)} AS DOUBLE)"
    return f"CAST(CAST(({spec.expr}) AS INT) AS DOUBLE)"


def _within_window(config: PlatformConfig, objective: str, known):
    """True where a positive's time falls inside the objective's attribution window (or no window)."""
    from pyspark.sql import functions as F

    window = attribution_window(config, objective)
    if window is None:
        return F.lit(True)
    return F.coalesce(known <= F.col("__event_timestamp") + F.expr(f"INTERVAL {int(window.total_seconds())} SECONDS"), F.lit(True))


@dataclass
class RawSource:
    """A source read as strings: `frame` has the raw columns, `_raw` (the line / record as text),
    `_file`, `_malformed`; `columns` are the raw column names."""

    source: Source
    files: list[str]
    columns: list[str]
    frame: object  # pyspark DataFrame


def read_raw(spark, source: Source, files: list[str], columns: list[str]) -> RawSource:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if source.format in ("csv", "tsv"):
        schema = T.StructType([T.StructField(c, T.StringType()) for c in columns] + [T.StructField(CORRUPT, T.StringType())])
        df = spark.read.csv(
            files, schema=schema, header=source.header, sep=SEP[source.format], mode="PERMISSIVE",
            columnNameOfCorruptRecord=CORRUPT, enforceSchema=True, nullValue="", emptyValue="",
        )
        joined = F.concat_ws(SEP[source.format], *[F.coalesce(F.col(q(c)), F.lit("")) for c in columns])
        df = df.withColumn("_malformed", F.col(CORRUPT).isNotNull()).withColumn("_raw", F.coalesce(F.col(CORRUPT), joined))
    elif source.format == "jsonl":
        schema = T.StructType([T.StructField(c, T.StringType()) for c in columns] + [T.StructField(CORRUPT, T.StringType())])
        text = spark.read.text(files).where(F.trim("value") != "")
        parsed = F.from_json("value", schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
        df = text.select(F.col("value").alias("_raw"), parsed.alias("_j")).select(
            "_raw", *[F.col("_j")[c].alias(c) for c in columns],
            (F.col("_j").isNull() | F.col("_j")[CORRUPT].isNotNull()).alias("_malformed"),
        )
    else:  # parquet: typed columns, read as their string form like the text formats
        df = spark.read.parquet(*files).select(*[F.col(q(c)).cast("string").alias(c) for c in columns])
        df = df.withColumn("_malformed", F.lit(False)).withColumn(
            "_raw", F.concat_ws(",", *[F.coalesce(F.col(q(c)), F.lit("")) for c in columns]))
    df = df.withColumn("_file", F.input_file_name())
    return RawSource(source, files, columns, df)


def tag(config: PlatformConfig, raw: RawSource, window: tuple[dt.datetime, dt.datetime] | None = None,
        domains: list[str] | None = None):
    """Raw rows -> consolidated columns + `_source`, `_reason`, `_detail`, `_raw`, `_file`,
    `_in_scope` (false: outside the run's --start/--end or domain filter, neither written nor
    quarantined)."""
    from pyspark.sql import functions as F

    source = raw.source
    canonical = canonical_sql(source)
    known_at_objs = known_at_objectives(config)
    objectives = {o.name: o for o in config.objectives}
    lo = dt.datetime.combine(config.time_range.start, dt.time())
    hi = dt.datetime.combine(config.time_range.end, dt.time())

    ex = F.expr
    df = raw.frame.select(
        "*",
        ex(example_id_sql(source, raw.columns)).alias("__example_id"),
        ex(event_time_sql(source)).alias("__event_timestamp"),
        ex(domain_sql(source)).alias("__domain"),
        ex(domain_value_sql(source)).alias("_domain_value"),
    )
    df = df.withColumn("__split", ex(split_sql(config, source)))
    checks: list[tuple[object, str, object]] = [
        (F.col("_malformed"), MALFORMED, F.lit(f"expected {len(raw.columns)} columns" if source.format in SEP else "not a JSON object")),
        (F.col("__event_timestamp").isNull(), BAD_TIMESTAMP,
         _cat(f"{source.event_time.column}=", F.col(q(source.event_time.column)) if source.event_time.column else F.lit(""))),
        ((F.col("__event_timestamp") < F.lit(lo)) | (F.col("__event_timestamp") >= F.lit(hi)), OUT_OF_RANGE,
         _cat("event_timestamp=", F.col("__event_timestamp").cast("string"))),
        (F.col("__domain").isNull(), UNKNOWN_DOMAIN, _cat("value=", F.col("_domain_value"))),
    ]
    if config.training.split.kind == "column":
        checks.append((F.col("__split").isNull(), BAD_SPLIT, _cat(f"{config.training.split.column}=", F.col(q(config.training.split.column)))))
    out_cols = [(F.col(q(c)) if c in source.passthrough else F.lit(None)).cast("string").alias(c) for c in S.passthrough_columns(config)]
    for f in config.entity_features:
        if f.column in canonical:
            v = canonical[f.column]
            checks.append((ex(null_like_sql(v)), NULL_KEY, _cat(f"{f.column}=", ex(v))))
            checks.append((ex(non_scalar_sql(v)), NULL_KEY, _cat(f"{f.column} is not one value: ", ex(v))))
    for col in S.sparse_columns(config):
        out_cols.append(ex(stable_id_sql(canonical[col]) if col in canonical else "CAST(NULL AS BIGINT)").alias(col))
    for f in config.features.sparse:
        # an exact-id table has one row per id: an id outside it is bad data, not a row to wrap
        if f.hashing == "none" and f.column in canonical:
            sid = stable_id_sql(canonical[f.column])
            checks.append((ex(f"{sid} < 0 OR {sid} >= {f.num_embeddings}"), BAD_ID,
                           _cat(f"{f.name} (hashing none, ids 0..{f.num_embeddings - 1})=", ex(canonical[f.column]))))
    ranges = {f.column: f for f in config.features.dense}
    for col in S.dense_columns(config):
        if col in canonical:
            v = canonical[col]
            parsed = f"try_cast({v} AS DOUBLE)"
            shown = _cat(f"{col}=", ex(v))
            checks.append((ex(f"{v} IS NOT NULL AND trim({v}) != '' AND {parsed} IS NULL"), BAD_VALUE, shown))
            checks.append((ex(f"isnan({parsed}) OR abs({parsed}) = double('inf')"), BAD_VALUE, shown))
            feat = ranges[col]
            if feat.transform == "log1p":
                checks.append((ex(f"{parsed} <= -1"), VALUE_OUT_OF_RANGE, _cat(f"{col} (log1p needs > -1)=", ex(v))))
            lo, hi = feat.valid_range or (None, None)
            if lo is not None or hi is not None:
                cond = " OR ".join(x for x in (f"{parsed} < {lo!r}" if lo is not None else "",
                                               f"{parsed} > {hi!r}" if hi is not None else "") if x)
                checks.append((ex(cond), VALUE_OUT_OF_RANGE, _cat(f"{col} (valid {[lo, hi]})=", ex(v))))
            out_cols += [ex(f"coalesce({parsed}, 0.0)").alias(col),
                         ex(f"CAST(CASE WHEN {parsed} IS NULL THEN 0 ELSE 1 END AS TINYINT)").alias(S.present_column(col))]
        else:
            out_cols += [F.lit(0.0).alias(col), F.lit(0).cast("tinyint").alias(S.present_column(col))]
    for obj in config.objectives:
        spec = source.labels.get(obj.name)
        carried = F.col("__domain").isin(obj.domains)
        if spec is None:
            out_cols += [F.lit(0).cast("tinyint").alias(S.label_column(obj.name)), F.lit(0).cast("tinyint").alias(S.mask_column(obj.name))]
        else:
            lab = ex(label_sql(spec))
            if spec.column:
                v = q(spec.column)
                is_null, shown = ex(f"{v} IS NULL OR trim({v}) = ''"), F.col(v)
            else:
                is_null, shown = lab.isNull(), lab.cast("string")
            checks.append((carried & is_null, NULL_LABEL, F.lit(f"{obj.name}: {spec.column or spec.expr} is null")))
            checks.append((carried & F.coalesce(~lab.isin(0.0, 1.0), F.lit(True)), BAD_LABEL, _cat(f"{obj.name}=", shown)))
            if spec.known_at:
                # a positive logged after its attribution window is not this objective's positive
                lab = F.when((lab == 1) & ~_within_window(config, obj.name, ex(event_time_sql(source, spec.known_at))), 0.0).otherwise(lab)
            out_cols += [F.when(carried, lab).otherwise(0).cast("tinyint").alias(S.label_column(obj.name)),
                         F.when(carried, 1).otherwise(0).cast("tinyint").alias(S.mask_column(obj.name))]
        truth = source.truth.get(obj.name)
        out_cols.append((ex(f"try_cast({q(truth)} AS DOUBLE)") if truth else F.lit(None).cast("double")).alias(S.truth_column(obj.name)))

    for obj in known_at_objs:
        # when the positive was logged: null on negatives and where the source gives no time
        spec = source.labels.get(obj)
        if spec is None or not spec.known_at:
            out_cols.append(F.lit(None).cast("timestamp").alias(S.known_column(obj)))
            continue
        known = ex(event_time_sql(source, spec.known_at))
        positive = F.col("__domain").isin(objectives[obj].domains) & (ex(label_sql(spec)) == 1)
        checks.append((positive & known.isNull(), LABEL_TIME_MISSING,
                       _cat(f"{obj}=1 but {spec.known_at}=", F.col(q(spec.known_at)))))
        checks.append((positive & (known < F.col("__event_timestamp")), LABEL_BEFORE_EVENT,
                       F.concat(F.lit(f"{obj}: {spec.known_at}="), known.cast("string"), F.lit(" before event_timestamp="),
                                F.col("__event_timestamp").cast("string"))))
        out_cols.append(F.when(positive & _within_window(config, obj, known), known).cast("timestamp").alias(S.known_column(obj)))

    for obj in config.objectives:
        # a conversion declared to follow a click cannot happen without one
        if obj.given and obj.name in source.labels and obj.given in source.labels:
            this, given = ex(label_sql(source.labels[obj.name])), ex(label_sql(source.labels[obj.given]))
            checks.append((F.col("__domain").isin(obj.domains) & (this == 1) & (given == 0), BAD_LABEL,
                           F.lit(f"{obj.name}=1 with {obj.given}=0, but {obj.name} is declared to follow {obj.given}")))
    reason = F.lit(None).cast("string")
    detail = F.lit(None).cast("string")
    for cond, code, why in reversed(checks):  # first check wins
        reason = F.when(F.coalesce(cond, F.lit(False)), F.lit(code)).otherwise(reason)
        detail = F.when(F.coalesce(cond, F.lit(False)), why).otherwise(detail)

    scope = F.lit(True)
    if window is not None:
        scope = scope & F.coalesce((F.col("__event_timestamp") >= F.lit(window[0])) & (F.col("__event_timestamp") < F.lit(window[1])), F.lit(True))
    if domains:
        scope = scope & F.coalesce(F.col("__domain").isin(domains), F.lit(True))

    # derived columns carry a `__` prefix until here: a raw column may be called `domain` (Douban)
    return df.select(
        F.col("__example_id").alias("example_id"), F.col("__event_timestamp").alias("event_timestamp"),
        F.date_format("__event_timestamp", "yyyy-MM-dd").alias("date"), F.col("__domain").alias("domain"),
        F.col("__split").alias("split"), *out_cols,
        F.lit(source.name).alias("_source"), reason.alias("_reason"), detail.alias("_detail"),
        "_raw", "_file",
        F.when(reason.isNull() | ~reason.isin(MALFORMED, BAD_TIMESTAMP, OUT_OF_RANGE, UNKNOWN_DOMAIN), scope)
        .otherwise(F.lit(True)).alias("_in_scope"),
    )
