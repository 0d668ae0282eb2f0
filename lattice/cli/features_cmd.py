"""`lattice features CONFIG [--start DATE --end DATE] [--workdir DIR] [--master M]`: the feature
pipeline (ingest -> validate -> consolidate -> aggregates -> Feast apply -> training set ->
materialize) with row counts per stage, the reconciliation table and a JSON summary."""

from __future__ import annotations

import argparse
import sys
import time

from lattice.cli.common import load_or_exit


def _stage_line(name: str, res: dict) -> str:
    if name == "consolidate":
        t = res["totals"]
        extra = f"in {t['rows_in']:,}  out {t['rows_out']:,}  quarantined {t['quarantined']:,}  skipped {t['skipped']:,}"
    elif name == "aggregates":
        extra = "  ".join(f"{k} {v['rows']:,} rows" for k, v in res["aggregates"].items()) or "no aggregates in the config"
    elif name == "feast_apply":
        extra = f"{len(res['entities'])} entities, {len(res['feature_views'])} feature views, services {res['feature_services'] or 'none yet (one per registered model version)'}"
    elif name == "training_set":
        extra = f"{res['rows']:,} rows, {len(res['aggregate_columns'])} aggregate columns"
    else:
        extra = f"{len(res['feature_views'])} feature views into {res.get('online_store', '-')}"
    return f"[{name:<12}] {res.get('seconds', 0):7.1f}s  {extra}"


def print_reconciliation(recon: list[dict], reasons: dict[str, int], out=sys.stdout) -> None:
    print(f"\n{'domain':<14}{'rows in':>12}{'rows out':>12}{'quarantined':>13}{'skipped':>10}  balanced", file=out)
    for r in recon:
        print(f"{r['domain']:<14}{r['rows_in']:>12,}{r['rows_out']:>12,}{r['quarantined']:>13,}{r['skipped']:>10,}  "
              f"{'yes' if r['balanced'] else 'NO'}", file=out)
    if reasons:
        print("quarantine reasons: " + ", ".join(f"{k} {v:,}" for k, v in reasons.items()), file=out)


def _features(args: argparse.Namespace) -> int:
    from lattice.paths import Paths

    config = load_or_exit(args.config)
    paths = Paths.for_config(config, args.workdir).ensure()
    from lattice.data.source_files import SourceError
    from pipelines.stages import run_features, summary_path
    from pipelines.validate import ValidationFailed

    print(f"features: {config.name} -> {paths.workdir}", flush=True)
    started = time.perf_counter()
    try:
        summary = run_features(config, paths, start=args.start, end=args.end,
                               domains=args.domains.split(",") if args.domains else None, master=args.master,
                               progress=lambda n, r: print(_stage_line(n, r), flush=True))
    except ValidationFailed as exc:
        print(f"\nvalidation failed: table-level expectations did not hold\n{exc}", file=sys.stderr)
        print(f"summary: {summary_path(paths)}", file=sys.stderr)
        return 1
    except (SourceError, FileNotFoundError, ValueError) as exc:
        print(f"features: {exc}", file=sys.stderr)
        return 1
    print_reconciliation(summary["reconciliation"], summary["quarantine_reasons"])
    identical = {k: v for k, v in summary.get("identical_rows", {}).items() if v}
    if identical:
        print("identical raw rows kept as distinct events (declare a source 'key' to deduplicate): "
              + ", ".join(f"{k} {v:,}" for k, v in identical.items()))
    for line in summary.get("losses", []) + summary.get("raw_suite_findings", []):
        print(f"note: {line}")
    if summary.get("split"):
        print(f"split: {summary['split'].get('rule')}")
    print(f"\ntraining set: {summary['paths']['training_set']} ({summary['counts']['training_set']:,} rows)")
    print(f"feature services: {', '.join(summary['feature_services']) or 'none yet (one per registered model version)'}   Data Docs: {summary['paths']['data_docs']}")
    print(f"summary: {summary_path(paths)}   ({time.perf_counter() - started:.1f}s)")
    return 0 if all(r["balanced"] for r in summary["reconciliation"]) else 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("features", help="run the feature pipeline: consolidate, validate, aggregates, Feast, training set")
    p.add_argument("config", help="platform config YAML, e.g. configs/demo.yaml")
    p.add_argument("--start", default=None, help="first date to process (yyyy-MM-dd); default: the config's time_range")
    p.add_argument("--end", default=None, help="end date, exclusive (yyyy-MM-dd)")
    p.add_argument("--domains", default=None, help="comma-separated domains to process (default: all)")
    p.add_argument("--workdir", default=None, help="work directory (default: the config's workdir)")
    p.add_argument("--master", default=None, help="Spark master (default: the scale-out profile's master if deployment.profile is scale-out, else local[2])")
    p.set_defaults(func=_features)
