"""Feature-pipeline benchmark: rows/s of the Spark stage on local[2] at 1M and 10M synthetic demo
rows, with the time of every sub-stage, the growth of the cost per row from the smallest to the
largest size, and the same consolidation done in pandas (lattice.data.local_consolidate) at the
smallest size in the same run, as a ratio.

    nice .venv/bin/python bench/bench_pipeline.py --rows 1000000            # one size
    nice .venv/bin/python bench/bench_pipeline.py --rows 1000000,10000000   # + growth 1M -> 10M
    .venv/bin/python bench/bench_pipeline.py --rows 20000 --stages consolidate,aggregates   # smoke

Prints the machine (cores, load average, memory) next to the figures: on a shared machine the
load average says how much of it the run really had.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ALL_STAGES = ["consolidate", "aggregates", "feast_apply", "training_set", "materialize"]


def machine() -> dict:
    mem = 0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        pass
    return {"cpus": os.cpu_count(), "load_avg": [round(x, 2) for x in os.getloadavg()], "mem_gib": round(mem, 1),
            "python": platform.python_version(), "platform": platform.platform()}


def run_size(config, rows: int, base: Path, stages: list[str], master: str) -> dict:
    from lattice.data.synth import generate
    from lattice.paths import Paths

    from pipelines.stages import _job

    raw = base / f"raw_{rows}"
    manifest = raw / "manifest.json"
    t = time.perf_counter()
    if not (manifest.exists() and json.loads(manifest.read_text()).get("rows") == rows):
        generate(config, rows, raw, progress=False)
    synth_s = time.perf_counter() - t
    cfg = config.model_copy(update={"data_root": str(raw)})
    paths = Paths(workdir=(base / f"wd_{rows}").resolve(), data_root=raw.resolve()).ensure()
    for sub in ("consolidated", "quarantine", "aggregates", "training_set", "feast", "validation", "source_schemas.json"):
        target = paths.workdir / sub
        if target.is_dir():
            import shutil

            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    out = {"rows": rows, "synth_seconds": round(synth_s, 2), "stages": {}, "load_avg_before": machine()["load_avg"]}
    for name in stages:
        t = time.perf_counter()
        res = _job(name)(cfg, paths, master=master)
        secs = time.perf_counter() - t
        out["stages"][name] = {"seconds": round(secs, 2), "rows_per_s": round(rows / secs), "sub": res.get("timings", {})}
        print(f"  {rows:>11,} rows  {name:<13} {secs:8.1f}s  {rows / secs:>10,.0f} rows/s  {res.get('timings', {})}", flush=True)
    total = sum(s["seconds"] for s in out["stages"].values())
    out.update(total_seconds=round(total, 2), rows_per_s=round(rows / total), us_per_row=round(1e6 * total / rows, 3),
               load_avg_after=machine()["load_avg"])
    return out


def pandas_baseline(config, rows: int, base: Path) -> dict:
    """The same consolidation (read every source, map to the canonical schema, write parquet)
    in one pandas process. No validation, no quarantine, no partitioning: a lower bound."""
    import glob

    import pandas as pd

    from lattice.data import local_consolidate as lc
    from lattice.paths import Paths

    def read(source, path):
        if source.format == "jsonl":  # pandas would parse `timestamp_ms` as dates by its name
            return pd.read_json(path, lines=True, dtype=False, convert_dates=False)
        return lc._read(source, Path(path))

    raw = base / f"raw_{rows}"
    cfg = config.model_copy(update={"data_root": str(raw)})
    paths = Paths(workdir=(base / f"wd_{rows}").resolve(), data_root=raw.resolve())
    t = time.perf_counter()
    frames = [lc.consolidate_source(cfg, s, read(s, f)) for s in cfg.sources
              for f in sorted(glob.glob(str(paths.source_path(s.path))))]
    df = pd.concat(frames, ignore_index=True).sort_values(["event_timestamp", "example_id"], kind="stable")
    read_s = time.perf_counter() - t
    lc.write_parquet(df, paths.workdir / "pandas_consolidated.parquet")
    secs = time.perf_counter() - t
    return {"rows": len(df), "seconds": round(secs, 2), "consolidate_seconds": round(read_s, 2), "rows_per_s": round(len(df) / secs)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1000000,10000000", help="comma-separated sizes (default 1M,10M)")
    p.add_argument("--stages", default=",".join(ALL_STAGES), help=f"sub-stages to run (default {','.join(ALL_STAGES)})")
    p.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    p.add_argument("--workdir", default=str(ROOT / ".lattice" / "bench"))
    p.add_argument("--master", default="local[2]")
    p.add_argument("--no-pandas", action="store_true", help="skip the pandas baseline")
    p.add_argument("--out", default=None, help="JSON file for the figures (default <workdir>/bench_pipeline.json)")
    args = p.parse_args(argv)
    if os.environ.get("LATTICE_BENCH_STACKS"):  # where is a slow run spending its time?
        import faulthandler

        faulthandler.dump_traceback_later(int(os.environ["LATTICE_BENCH_STACKS"]), repeat=True)

    from lattice.config import load_config

    from pipelines.spark import get_spark

    config = load_config(args.config)
    sizes = sorted(int(x) for x in args.rows.split(","))
    stages = [s for s in args.stages.split(",") if s]
    base = Path(args.workdir)
    base.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine(), "master": args.master, "stages": stages, "sizes": []}
    print(f"machine: {report['machine']}\nmaster: {args.master}  stages: {stages}", flush=True)
    t = time.perf_counter()
    get_spark(args.master)
    report["spark_startup_seconds"] = round(time.perf_counter() - t, 2)
    for n in sizes:
        report["sizes"].append(run_size(config, n, base, stages, args.master))
    if not args.no_pandas:
        n = sizes[0]
        report["pandas"] = pandas_baseline(config, n, base)
        spark_cons = report["sizes"][0]["stages"].get("consolidate", {}).get("seconds")
        if spark_cons:
            report["pandas"]["spark_over_pandas_time"] = round(spark_cons / report["pandas"]["seconds"], 2)
        print(f"  pandas consolidation at {n:,} rows: {report['pandas']}", flush=True)
    if len(sizes) > 1:
        a, b = report["sizes"][0], report["sizes"][-1]
        report["cost_per_row_growth"] = round(b["us_per_row"] / a["us_per_row"] - 1, 3)
    report["machine_after"] = machine()
    out = Path(args.out) if args.out else base / "bench_pipeline.json"
    out.write_text(json.dumps(report, indent=2))
    print("\nsize        total s   rows/s     us/row")
    for s in report["sizes"]:
        print(f"{s['rows']:>10,} {s['total_seconds']:>9.1f} {s['rows_per_s']:>9,} {s['us_per_row']:>9.2f}")
    if "cost_per_row_growth" in report:
        print(f"cost per row growth {sizes[0]:,} -> {sizes[-1]:,}: {report['cost_per_row_growth']:+.1%} (target <= +20%)")
    if "pandas" in report and "spark_over_pandas_time" in report["pandas"]:
        print(f"consolidation, Spark / pandas time at {sizes[0]:,} rows: {report['pandas']['spark_over_pandas_time']}x")
    print(f"figures: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
