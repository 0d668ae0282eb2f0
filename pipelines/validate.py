"""Great Expectations 1.x suites of the feature pipeline (GX called directly, not through Feast).

GX on Spark computes every metric as its own Spark job (about 30 s per suite on 20k rows on two
cores), so the suites run on pandas frames that Spark prepares in one pass each:

- one **raw suite per source** on the source's raw rows (all rows up to `LATTICE_GX_RAW_ROWS`,
  default 100,000, else the first that many): required columns present, keys not null, labels in
  {0,1}, timestamps parseable and inside the configured range, domain values known, dense values
  numeric. Row-level failures are expected and not fatal: Spark quarantines the same rows (on
  every row) with the same reasons, and the suite's unexpected counts say how many.
- the **consolidated suite** on a sample of the rows about to be written: exact column set,
  unique non-null `example_id`, labels and masks in {0,1}, label <= mask.
- the **table suite** on a per-(domain, objective) aggregate of *all* rows about to be written
  (computed by Spark): rows per domain >= `domain.min_rows`, no duplicate or null `example_id`,
  no label without a mask, no labels where the domain does not carry the objective, label rate
  within `objective.label_rate` where it does (on enough labels for a breach to be meaningful:
  the low bound where it predicts >= 3 positives, the high bound from 30 labels). A failure in either of the last two stops the run
  before the table is written.

Every suite runs through a GX Checkpoint with an UpdateDataDocsAction, so the Data Docs site under
`paths.validation` shows every run.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from lattice.config import PlatformConfig
from lattice.config.schema import Source
from lattice.data import schema as S

from pipelines.ingest import domain_sql, event_time_sql, q
from pipelines.sources import required_columns


@dataclass
class SuiteResult:
    suite: str
    success: bool
    evaluated: int
    failures: list[dict] = field(default_factory=list)
    unexpected: dict[str, int] = field(default_factory=dict)
    rows: int = 0
    """expectation label -> unexpected row count (row-level expectations)."""

    def report(self) -> str:
        lines = [f"suite {self.suite}: {'passed' if self.success else 'FAILED'} ({self.evaluated} expectations)"]
        for f in self.failures:
            lines.append(f"  - {f['expectation']}{' on ' + f['column'] if f.get('column') else ''}: {f['why']}")
        return "\n".join(lines)


class ValidationFailed(RuntimeError):
    """A table-level expectation failed: the run stops before publishing the table."""

    def __init__(self, results: list[SuiteResult], docs: str | None, losses: list[str] | None = None):
        self.results = results
        self.docs = docs
        self.losses = losses or []
        body = "\n".join(r.report() for r in results if not r.success)
        # what happened to the rows first (domain, source, reason, count); the suite detail after
        why = "".join(f"\n  {line}" for line in self.losses)
        super().__init__(f"validation failed; nothing was written to the consolidated table{why}\n{body}"
                         + (f"\nData Docs: {docs}" if docs else ""))


class Validator:
    """A file-backed GX context under `paths.validation` (suites, results and Data Docs persist)."""

    def __init__(self, root: Path):
        import great_expectations as gx

        logging.getLogger("great_expectations").setLevel(logging.ERROR)
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.ctx = gx.get_context(mode="file", project_root_dir=str(root))
        # the results of this run, rendered into Data Docs once by build_docs(): a docs action on
        # every checkpoint rebuilt the site once per suite (5 builds, about 1 s each, per run)
        self._rendered: list = []
        try:
            from great_expectations.data_context.types.base import ProgressBarsConfig

            self.ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        except Exception:  # cosmetic only
            pass

    def _batch_definition(self, engine: str, asset_name: str):
        ds = self.ctx.data_sources.add_or_update_spark(name="spark") if engine == "spark" else \
            self.ctx.data_sources.add_or_update_pandas(name="pandas")
        try:
            asset = ds.get_asset(asset_name)
        except LookupError:
            asset = ds.add_dataframe_asset(name=asset_name)
        try:
            return asset.get_batch_definition("all")
        except (LookupError, KeyError, ValueError):
            return asset.add_batch_definition_whole_dataframe("all")

    def run(self, name: str, frame, expectations: list, engine: str, run_id: str) -> SuiteResult:
        import great_expectations as gx
        from great_expectations.core.run_identifier import RunIdentifier
        from great_expectations.data_context.types.resource_identifiers import ExpectationSuiteIdentifier

        suite = gx.ExpectationSuite(name=name)
        for e in expectations:
            suite.add_expectation(e)
        suite = self.ctx.suites.add_or_update(suite)
        vd = self.ctx.validation_definitions.add_or_update(
            gx.ValidationDefinition(name=name, data=self._batch_definition(engine, name), suite=suite))
        cp = self.ctx.checkpoints.add_or_update(gx.Checkpoint(
            name=name, validation_definitions=[vd], actions=[], result_format={"result_format": "SUMMARY"}))
        res = cp.run(batch_parameters={"dataframe": frame}, run_id=RunIdentifier(run_name=run_id))
        ((key, vres),) = res.run_results.items()
        self._rendered += [key, ExpectationSuiteIdentifier(name=name)]
        out = SuiteResult(name, bool(vres.success), len(vres.results))
        for r in vres.results:
            cfg = r.expectation_config
            info = r.result or {}
            label = f"{cfg.type}({cfg.kwargs.get('column') or cfg.kwargs.get('column_A') or ''})"
            if "unexpected_count" in info:
                out.unexpected[label] = int(info.get("unexpected_count") or 0)
            if not r.success:
                if r.exception_info and r.exception_info.get("raised_exception"):
                    why = f"raised {r.exception_info.get('exception_message')}"
                elif "observed_value" in info:
                    why = f"observed {info['observed_value']!r}"
                else:
                    why = f"{info.get('unexpected_count')} of {info.get('element_count')} rows unexpected, e.g. {info.get('partial_unexpected_list', [])[:5]}"
                kw = {k: v for k, v in cfg.kwargs.items() if k not in ("column", "batch_id", "result_format")}
                out.failures.append({"expectation": cfg.type, "column": cfg.kwargs.get("column") or
                                     (f"{cfg.kwargs.get('column_A')} vs {cfg.kwargs.get('column_B')}" if "column_A" in cfg.kwargs else None),
                                     "why": why, "expected": json.loads(json.dumps(kw, default=str))})
        return out

    def build_docs(self) -> str | None:
        """Render this run's results (and their suites) into the Data Docs site in one build, and
        return the site's index page."""
        if self._rendered:
            self.ctx.build_data_docs(resource_identifiers=self._rendered)
            self._rendered = []
        return self.docs_index()

    def docs_index(self) -> str | None:
        site = self.root / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"
        return str(site) if site.exists() else None


# ---------------------------------------------------------------- suites


def _micros(d: dt.date) -> int:
    return int(dt.datetime.combine(d, dt.time(), tzinfo=dt.timezone.utc).timestamp() * 1_000_000)


def raw_frame(source: Source, frame):
    """Raw string columns plus the two derived columns the raw suite needs (parsed time in
    micros, mapped domain); the same SQL the ingest uses, so counts agree with the quarantine."""
    from pyspark.sql import functions as F

    return frame.select(
        *[F.col(q(c)) for c in frame.columns if not c.startswith("_")], "_malformed",
        F.expr(f"unix_micros({event_time_sql(source)})").alias("_event_micros"),
        F.expr(domain_sql(source)).alias("_domain"),
    )


def raw_sample_rows() -> int:
    return int(os.environ.get("LATTICE_GX_RAW_ROWS", "100000"))


def to_pandas(frame, limit: int):
    """At most `limit` rows of a Spark frame as pandas (Arrow transfer)."""
    return frame.limit(limit).toPandas() if limit > 0 else frame.toPandas()


def raw_expectations(config: PlatformConfig, source: Source) -> list:
    import great_expectations as gx

    E = gx.expectations
    out = [
        E.ExpectTableColumnsToMatchSet(column_set=required_columns(source) + ["_malformed", "_event_micros", "_domain"], exact_match=False),
        E.ExpectColumnValuesToBeInSet(column="_malformed", value_set=[False]),
        E.ExpectColumnValuesToNotBeNull(column="_event_micros"),
        E.ExpectColumnValuesToBeBetween(column="_event_micros", min_value=_micros(config.time_range.start),
                                        max_value=_micros(config.time_range.end), strict_max=True),
        E.ExpectColumnValuesToNotBeNull(column="_domain"),
        E.ExpectColumnValuesToBeInSet(column="_domain", value_set=config.domain_names),
    ]
    entity_cols = {f.column for f in config.entity_features}
    for raw_name, canon in source.columns.items():
        if canon in entity_cols:
            out.append(E.ExpectColumnValuesToNotBeNull(column=raw_name))
    dense = set(S.dense_columns(config))
    for raw_name, canon in source.columns.items():
        if canon in dense:
            out.append(E.ExpectColumnValuesToMatchRegex(column=raw_name, regex=r"^\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\s*$"))
    for obj, spec in source.labels.items():
        if spec.column:
            out.append(E.ExpectColumnValuesToNotBeNull(column=spec.column))
            out.append(E.ExpectColumnValuesToBeInSet(column=spec.column, value_set=["0", "1", "0.0", "1.0"]))
    return out


def consolidated_expectations(config: PlatformConfig) -> list:
    import great_expectations as gx

    E = gx.expectations
    out = [
        E.ExpectTableColumnsToMatchSet(column_set=S.consolidated_columns(config), exact_match=True),
        E.ExpectColumnValuesToNotBeNull(column="example_id"),
        E.ExpectColumnValuesToBeUnique(column="example_id"),
        E.ExpectColumnValuesToNotBeNull(column="event_timestamp"),
        E.ExpectColumnValuesToBeInSet(column="domain", value_set=config.domain_names),
        E.ExpectColumnValuesToBeInSet(column="split", value_set=["train", "validation", "test"]),
        E.ExpectColumnValuesToNotBeNull(column="split"),
    ]
    for obj in config.objective_names:
        lab, mask = S.label_column(obj), S.mask_column(obj)
        out += [
            E.ExpectColumnValuesToBeInSet(column=lab, value_set=[0, 1]),
            E.ExpectColumnValuesToBeInSet(column=mask, value_set=[0, 1]),
            E.ExpectColumnPairValuesAToBeGreaterThanB(column_A=mask, column_B=lab, or_equal=True),
        ]
    return out


def cell_table(config: PlatformConfig, counts: dict[str, dict], domains: list[str]):
    """Per (domain, objective) pandas table from `counts[domain] = {rows, labeled_<o>, positives_<o>}`."""
    import pandas as pd

    min_rows = {d.name: d.min_rows for d in config.domains}
    rows = []
    for d in domains:
        c = counts.get(d, {})
        for o in config.objectives:
            labeled, pos = int(c.get(f"labeled_{o.name}", 0)), int(c.get(f"positives_{o.name}", 0))
            carries = d in o.domains
            rows.append({
                "domain": d, "objective": o.name, "rows": int(c.get("rows", 0)), "min_rows": min_rows[d],
                "carries": carries, "labeled": labeled, "positives": pos,
                "rate": pos / labeled if labeled else 0.0, "rate_low": o.label_rate[0], "rate_high": o.label_rate[1],
                "distinct_ids": int(c.get("distinct_ids", 0)), "null_ids": int(c.get("null_ids", 0)),
                "label_without_mask": int(c.get(f"label_without_mask_{o.name}", 0)),
                "bad_label_values": int(c.get(f"bad_label_values_{o.name}", 0)),
                "labeled_where_not_carried": 0 if carries else labeled,
                # a rate bound is only checked on enough labels for a breach to mean something:
                # the low bound where it predicts >= 3 positives, the high bound from 30 labels
                "check_low": carries and labeled * o.label_rate[0] >= 3,
                "check_high": carries and labeled >= 30,
            })
    return pd.DataFrame(rows)


def table_expectations() -> list:
    import great_expectations as gx

    E = gx.expectations
    zero = dict(min_value=0, max_value=0)
    return [
        E.ExpectColumnPairValuesAToBeGreaterThanB(column_A="rows", column_B="min_rows", or_equal=True),
        E.ExpectColumnPairValuesToBeEqual(column_A="distinct_ids", column_B="rows"),
        E.ExpectColumnValuesToBeBetween(column="null_ids", **zero),
        E.ExpectColumnValuesToBeBetween(column="label_without_mask", **zero),
        E.ExpectColumnValuesToBeBetween(column="bad_label_values", **zero),
        E.ExpectColumnValuesToBeBetween(column="labeled_where_not_carried", **zero),
        E.ExpectColumnPairValuesAToBeGreaterThanB(column_A="rate", column_B="rate_low", or_equal=True,
                                                  row_condition="check_low == True", condition_parser="pandas"),
        E.ExpectColumnPairValuesAToBeGreaterThanB(column_A="rate_high", column_B="rate", or_equal=True,
                                                  row_condition="check_high == True", condition_parser="pandas"),
    ]
