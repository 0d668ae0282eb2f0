"""Hash-fit benchmark: seconds of `lattice hashing fit` on a synthetic consolidated table.

    nice .venv/bin/python bench/bench_hash_fit.py --rows 1000000
    nice .venv/bin/python bench/bench_hash_fit.py --rows 10000000 --users 2500000 --ads 250000

The table is written straight from numpy in the pipeline's layout (date=/domain=/part.parquet,
a `split` column, labels and masks) so that the fit is what is timed, not the log generator:
user and ad ids Zipf-distributed over their id spaces, clicks driven by a per-id effect (so the
learned clustering has something to find). The demo config is used with user_id and ad_id
switched to `hashing: learned` (their 200k / 50k row budgets; the student's table_scale adds a
second budget each) and device to `mixed`. Goal: the fit on 10M rows under a tenth of the
teacher's training time on the same rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lattice.config import PlatformConfig, load_config  # noqa: E402
from lattice.paths import Paths  # noqa: E402

DATES = [f"2026-01-{d:02d}" for d in range(1, 15)]


def _zipf_ids(rng: np.random.Generator, n: int, space: int, a: float = 1.1) -> np.ndarray:
    """n draws from `space` ids with Zipf-like popularity (rank^-a), ids scattered in int64."""
    p = np.arange(1, space + 1, dtype=np.float64) ** -a
    rank = rng.choice(space, n, p=p / p.sum())
    return (rank.astype(np.int64) * 2654435761 + 12345) % (2**40)  # a fixed scatter of the ranks


def write_table(config: PlatformConfig, paths: Paths, rows: int, users: int, ads: int, seed: int = 0,
                chunk: int = 1_000_000) -> float:
    import pyarrow as pa
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    doms = config.domain_names
    part = 0
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        user, ad = _zipf_ids(rng, n, users), _zipf_ids(rng, n, ads)
        domain = rng.choice(doms, n)
        # a per-id effect on the click logit (a hash of the id: the same id, the same effect)
        effect = ((user * 7919 % 1000) / 1000 - 0.5) + ((ad * 104729 % 1000) / 1000 - 0.5)
        click = (rng.random(n) < 1 / (1 + np.exp(-(-2.5 + 1.5 * effect)))).astype(np.int8)
        conv_mask = np.isin(domain, ["feed", "search"]).astype(np.int8)
        date = rng.choice(DATES, n)
        cols = {
            "example_id": pa.array(np.char.add("e", np.arange(start, start + n).astype(str))),
            "split": pa.array(rng.choice(["train"] * 8 + ["validation", "test"], n)),
            "user_id": user, "ad_id": ad, "user_segment": user % 64, "ad_category": ad % 128,
            "device": rng.integers(0, 12, n).astype(np.int64), "position": rng.integers(0, 8, n).astype(np.int64),
            "query_category": rng.integers(0, 100, n).astype(np.int64),
            "label_click": click, "mask_click": np.ones(n, np.int8),
            "label_conversion": (click * (rng.random(n) < 0.1) * conv_mask).astype(np.int8), "mask_conversion": conv_mask,
        }
        tbl = pa.table({k: v if isinstance(v, pa.Array) else pa.array(v) for k, v in cols.items()})
        for d in DATES:
            for dom in doms:
                keep = np.flatnonzero((date == d) & (domain == dom))
                f = paths.consolidated / f"date={d}" / f"domain={dom}" / f"part-{part:05d}.parquet"
                f.parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(tbl.take(pa.array(keep)), f)
        part += 1
    return time.perf_counter() - t0


def _cpu_seconds() -> float:
    """CPU seconds of this process and its children (the Spark JVM): on a shared machine the wall
    time depends on the neighbours, the CPU time much less."""
    import psutil

    procs = [psutil.Process()]
    procs += procs[0].children(recursive=True)
    total = 0.0
    for pr in procs:
        try:
            t = pr.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def bench_config(base: PlatformConfig, data_root: Path) -> PlatformConfig:
    keys = {"user_id": {"hashing": "learned"}, "ad_id": {"hashing": "learned"}, "device": {"hashing": "mixed"}}
    sparse = [f.model_copy(update=keys.get(f.name, {})) for f in base.features.sparse]
    return base.model_copy(update={"features": base.features.model_copy(update={"sparse": sparse}),
                                   "data_root": str(data_root)})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--users", type=int, default=200_000)
    p.add_argument("--ads", type=int, default=50_000)
    p.add_argument("--workdir", default=None)
    p.add_argument("--master", default=None)
    args = p.parse_args()
    workdir = Path(args.workdir or ROOT / ".lattice" / f"bench_hashing_{args.rows}")
    config = bench_config(load_config(args.config), workdir / "raw")
    paths = Paths.for_config(config, workdir)
    write_s = None
    if not paths.consolidated.is_dir():
        write_s = write_table(config, paths, args.rows, args.users, args.ads)
        print(f"table: {args.rows:,} rows written in {write_s:.1f}s -> {paths.consolidated}", flush=True)
    from lattice.cli.hashing_cmd import fit_line
    from lattice.hashing.fit import fit_hashing
    from pipelines.spark import get_spark

    t = time.perf_counter()
    get_spark(args.master, app_name="lattice-hashing")
    spark_s = time.perf_counter() - t
    cpu0 = _cpu_seconds()
    t = time.perf_counter()
    summary = fit_hashing(config, paths, master=args.master,
                          progress=lambda f, fits: [print(fit_line(f, r, m), flush=True) for r, m in fits.items()])
    fit_s = time.perf_counter() - t
    cpu_s = _cpu_seconds() - cpu0
    result = {"rows": args.rows, "train_rows": summary["window"]["rows"], "spark_start_s": round(spark_s, 1),
              "fit_s": round(fit_s, 1), "fit_cpu_s": round(cpu_s, 1), "write_table_s": None if write_s is None else round(write_s, 1),
              "timings": summary["timings"], "features": summary["features"]}
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
