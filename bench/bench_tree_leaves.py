"""Tree leaves in the teacher (issue 38): the teacher (optionally the student) with `models.leaves`
on and off, the platform's `gbdt` baseline and LightGBM at its own default settings, on the same
table, split and test rows; per objective macro test NE and, against the teacher with leaves,
the paired bootstrap 95% interval of `lattice evaluate` (bench_peers.versus_reference).

    nice -n 10 .venv/bin/python bench/bench_tree_leaves.py --datasets bank           # choose
    nice -n 10 .venv/bin/python bench/bench_tree_leaves.py --datasets criteo,taobao,demo --reuse   # confirm

Datasets:
- `bank`: UCI Bank Marketing (`$LATTICE_SHARED_DATA/bank_marketing/bank-full.csv`, 45,211 rows in
  time order), written here as a consolidated table: the year is recovered from the month order
  (May 2008 .. Nov 2010), split by time (first 70% of the days train, next 15% validation, last
  test), domain = `contact` (cellular / telephone / unknown), one objective `y`, `duration` left
  out (known only after the call). Dense: age, balance, day, campaign, pdays, previous; sparse:
  job, marital, education, default, housing, loan, month, poutcome.
- `criteo`, `taobao`: the shipped configs through `lattice features` (its own process, as
  bench_peers does); `demo`: the synthetic demo (`--demo-rows`), its pandas local table.

Per dataset: `lattice trees fit` (models.leaves: `--num-trees`, `--num-leaves`), then `gbdt`,
`gbdt@lgb_default` (LightGBM's defaults: 31 leaves, learning rate 0.1, 20 rows per leaf, no L2;
early stopping on validation as every booster here), `teacher` (leaves off), `teacher@leaves`
(leaves on), and with `--student` the students distilled from each. `--fit-shares 1,0.5`: also
`teacher@xfit50`, the teacher with leaves of trees fitted on half the train rows (cross-fitting,
models.leaves.fit_share), fitted and trained first, then the trees refitted on every train row. Writes
.lattice/bench/bench_tree_leaves.json. Asserts nothing. Keep it `nice`: the dev machine has 2
shared cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SHARED = Path(os.environ.get("LATTICE_SHARED_DATA", ROOT.parent / "shared" / "data"))
MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
BANK_SPARSE = ["job", "marital", "education", "default", "housing", "loan", "month", "poutcome"]
BANK_DENSE = {"age": "none", "balance": "none", "day": "none", "campaign": "log1p", "pdays": "none", "previous": "log1p"}
LGB_DEFAULT = {"num_leaves": 31, "learning_rate": 0.1, "min_data_in_leaf": 20, "lambda_l2": 0.0}


# ---------------------------------------------------------------- datasets


def bank_config(workdir: Path, cut: tuple[str, str]) -> "PlatformConfig":  # noqa: F821
    from lattice.config import parse_config

    d = {
        "name": "bank", "description": "UCI Bank Marketing, time order, contact as domain (bench_tree_leaves)",
        "data_root": str(SHARED / "bank_marketing"), "workdir": str(workdir),
        "time_range": {"start": "2008-05-01", "end": "2010-12-01"},
        "domains": [{"name": c, "min_rows": 1} for c in ("cellular", "telephone", "unknown")],
        "objectives": [{"name": "y", "domains": ["cellular", "telephone", "unknown"], "label_rate": [0.01, 0.6]}],
        "sources": [{"name": "bank", "path": "bank-full.csv", "format": "csv", "header": True, "domain": {"column": "contact", "map": {c: c for c in ("cellular", "telephone", "unknown")}},
                     "columns": {c: c for c in BANK_SPARSE + list(BANK_DENSE)},
                     "event_time": {"format": "constant", "value": "2008-05-01T00:00:00"}, "labels": {"y": {"column": "y"}}}],
        "features": {"sparse": [{"name": c, "column": c, "embedding_dim": 8, "num_embeddings": 64, "hashing": "modulo"} for c in BANK_SPARSE],
                     "dense": [{"name": c, "column": c, "transform": t} for c, t in BANK_DENSE.items()], "aggregates": []},
        "models": {"teacher": {"embedding_dim": 16, "num_layers": 2, "num_tokens": 8, "fm_rank": 8, "head_dims": [64]},
                   "student": {"embedding_dim": 4, "num_layers": 1, "num_tokens": 4, "fm_rank": 4, "head_dims": [16]}},
        "training": {"batch_size": 512, "epochs": 3, "num_workers": 0,
                     "split": {"kind": "time", "validation_start": cut[0], "test_start": cut[1]}},
    }
    return parse_config(d, "bench_tree_leaves:bank")


def bank_table(workdir: Path, split_kind: str = "time"):
    """The bank CSV as a consolidated table (lattice.data.schema) under the work folder."""
    from lattice.data import schema as S
    from lattice.paths import Paths

    raw = pd.read_csv(SHARED / "bank_marketing" / "bank-full.csv", sep=",")
    month = raw["month"].map(MONTHS.index).to_numpy()
    # the rows are in time order: a new year where the month falls back by more than half a year
    year = 2008 + np.concatenate([[0], np.cumsum(np.diff(month) < -6)])
    day = pd.to_datetime(pd.DataFrame({"year": year, "month": month + 1, "day": raw["day"]}), errors="coerce").ffill()
    day = pd.Series(np.maximum.accumulate(day.to_numpy()))  # a row never goes back in time
    ts = day + pd.to_timedelta(day.groupby(day).cumcount(), unit="s")  # strictly increasing, the file's order within a day
    # time split by rows: the first 70% train, the next 15% validation, the last 15% test
    cut = (ts.iloc[int(0.70 * len(ts))], ts.iloc[int(0.85 * len(ts))])
    config = bank_config(workdir, (cut[0].isoformat(), cut[1].isoformat()))
    paths = Paths.for_config(config, workdir)
    paths.ensure()
    out = pd.DataFrame({"example_id": [f"bank-{i}" for i in range(len(raw))], "event_timestamp": ts,
                        "split": np.where(ts < cut[0], "train", np.where(ts < cut[1], "validation", "test"))})
    if split_kind == "hash":  # the same 70 / 15 / 15, drawn at random (seeded): no drift between the splits
        u = np.random.default_rng(38).random(len(out))
        out["split"] = np.where(u < 0.70, "train", np.where(u < 0.85, "validation", "test"))
    for c in BANK_SPARSE:
        out[c] = raw[c].astype(str).map(S.stable_id).astype("int64")
    for c in BANK_DENSE:
        out[c] = raw[c].astype(float)
    out[S.label_column("y")] = (raw["y"] == "yes").astype("int8")
    out[S.mask_column("y")] = np.int8(1)
    out["date"], out["domain"] = ts.dt.strftime("%Y-%m"), raw["contact"].to_numpy()  # monthly folders: few files
    root = paths.consolidated
    if root.exists():
        import shutil

        shutil.rmtree(root)
    for (date, domain), g in out.groupby(["date", "domain"], sort=True):
        f = root / f"date={date}" / f"domain={domain}" / "part-00000.parquet"
        f.parent.mkdir(parents=True, exist_ok=True)
        g.drop(columns=["date", "domain"]).to_parquet(f, index=False, coerce_timestamps="us", allow_truncated_timestamps=True)
    split = out["split"].value_counts().to_dict()
    print(f"[bank] {len(out):,} rows, split {split}, positives {int(out['label_y'].sum()):,}, cut {cut[0].date()} / {cut[1].date()}",
          flush=True)
    return config, paths


def shipped(name: str, workdir: Path, reuse: bool, demo_rows: int, overrides: list[str]):
    from lattice.config import load_config
    from lattice.paths import Paths

    cfg_file = ROOT / "configs" / f"{name}.yaml"
    config = load_config(cfg_file, overrides)
    if name == "demo":
        config = config.model_copy(update={"data_root": str(workdir / "raw")})
    paths = Paths.for_config(config, workdir)
    paths.ensure()
    if name == "demo":
        from lattice.data.local_table import write_local_table
        from lattice.data.synth import generate

        if not (reuse and paths.consolidated.exists() and any(paths.consolidated.rglob("*.parquet"))):
            generate(config, demo_rows, workdir / "raw", progress=False)
            write_local_table(config, paths)
        return config, paths
    if not (reuse and paths.training_set.exists() and any(paths.training_set.rglob("*.parquet"))):
        t = time.perf_counter()
        env = {**os.environ, "LATTICE_SHARED_DATA": str(SHARED)}
        r = subprocess.run([sys.executable, "-m", "lattice.cli", "features", str(cfg_file), "--workdir", str(paths.workdir)],
                           capture_output=True, text=True, env=env)
        if r.returncode:
            raise SystemExit(f"[{name}] lattice features failed (rc {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        print(f"[{name}] features ({time.perf_counter() - t:.0f}s)", flush=True)
    return config, paths


# ---------------------------------------------------------------- models


def with_leaves(config, models: list[str], num_trees: int, num_leaves: int, margin: tuple[str, ...] = (),
                pooling: str | None = None, fit_share: float = 1.0):
    m = config.models
    pool = ({"pooling": {"teacher": pooling.split(",")[0], "student": pooling.split(",")[-1]}} if pooling else {})
    leaves = m.leaves.model_copy(update={"models": models, "num_trees": num_trees, "num_leaves": num_leaves,
                                         "margin": list(margin), "fit_share": fit_share, **pool})
    return config.model_copy(update={"models": m.model_copy(update={"leaves": leaves})})


def lgb_default(config):
    m = config.models
    trees = m.baselines.trees.model_copy(update=LGB_DEFAULT)
    return config.model_copy(update={"models": m.model_copy(update={"baselines": m.baselines.model_copy(update={"trees": trees})})})


def run_one(config, paths, model: str, epochs: int | None, teacher_scores=None) -> dict:
    from lattice.training.stages import train

    t = time.perf_counter()
    s = train(config, paths, model=model, nproc=1, epochs=epochs, progress=False, teacher_scores=teacher_scores)
    secs = time.perf_counter() - t
    metrics = json.loads((paths.model_dir(model) / "metrics.json").read_text())
    by_obj = {o: v["ne"] for o, v in metrics["by_objective"].items()}
    auc = {o: v.get("auc") for o, v in metrics["by_objective"].items()}
    print(f"  {model}: {secs:.0f}s, test macro NE " + ", ".join(f"{o} {v:.4f}" for o, v in by_obj.items()), flush=True)
    return {"test_predictions": pd.read_parquet(paths.model_dir(model) / "predictions.parquet"),
            "cells": {c: v["ne"] for c, v in metrics["cells"].items()}, "by_objective": by_obj, "auc": auc,
            "calibration": {c: v.get("calibration") for c, v in metrics["cells"].items()},
            "examples_per_s": float("nan"), "seconds": secs, "best_epoch": s.get("best_epoch")}


def leaf_latency(config, paths, reps: int = 2000) -> dict:
    """What LightGBM beside the TorchScript module would add to a request: the forest's leaf ids
    (matrix from the raw columns + pred_leaf of every booster) for 1 and for 256 rows, p50 / p99 ms."""
    from lattice.data.loader import RowEncoder, find_table
    from lattice.trees.leaves import LeafForest

    forest = LeafForest.load(paths.trees)
    enc = RowEncoder(config, forest.stats)
    import pyarrow as pa

    tbl = pa.Table.from_pandas(pd.read_parquet(find_table(paths)).head(256), preserve_index=False)
    part: dict = {}
    arrs = enc.encode(tbl, part)
    n = len(arrs["domain"])
    dense = {c.column: (tbl.column(c.column).to_numpy(zero_copy_only=False).astype(float)[:n] if c.column in tbl.column_names
                        else np.zeros(n)) for c in forest.stats.columns}
    ids = {e.name: (arrs[f"id:{e.name}"], arrs[f"has:{e.name}"]) for e in forest.sparse}
    out = {}
    for rows in (1, min(256, n)):
        d = {k: v[:rows] for k, v in dense.items()}
        i = {k: (a[:rows], b[:rows]) for k, (a, b) in ids.items()}
        forest.arrays(d, i, arrs["domain"][:rows], rows)  # boosters loaded
        times = []
        for _ in range(reps if rows == 1 else reps // 10):
            t = time.perf_counter()
            forest.arrays(d, i, arrs["domain"][:rows], rows)
            times.append((time.perf_counter() - t) * 1e3)
        out[f"batch_{rows}"] = {"p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99))}
    print("leaf ids per request (LightGBM pred_leaf in the predictor): " + ", ".join(
        f"{k} p50 {v['p50_ms']:.3f} ms, p99 {v['p99_ms']:.3f} ms" for k, v in out.items()), flush=True)
    return out


def export_latency(config, paths, rounds: int = 3, iterations: int = 1000, margin: bool = False,
                   models: tuple[str, ...] | None = None) -> dict:
    """The exported student without and with leaves (and with `margin`, with leaves and the
    trees' margin), or the trained `models` named, in alternation: single-request latency
    through `Predictor.predict_table` (lattice.export.window.latency_ms: wall and CPU time, 1
    torch thread), as serving runs it, and the CPU of a 256-row call."""
    from lattice.export.predictor import Predictor
    from lattice.export.stages import export_model
    from lattice.export.window import latency_ms, load_window

    out: dict[str, list[dict]] = {}
    window = load_window(config, paths, "test", max_rows=4096)
    for _ in range(rounds):
        for m in models or ("student", "student@leaves") + (("student@margin",) if margin else ()):
            s = export_model(config, paths, m)
            predictor = Predictor.load(Path(s["artifact"]))
            lat = latency_ms(predictor, window, iterations=iterations)
            lat.update(batch_cpu_ms(predictor, window))
            out.setdefault(m, []).append({**lat, "max_abs_diff": s["max_abs_diff"]})
            print(f"  export {m}: " + ", ".join(f"{k} {v:.3f}" for k, v in lat.items()), flush=True)
    return out


def batch_cpu_ms(predictor, frame: pd.DataFrame, rows: int = 256, iterations: int = 200) -> dict[str, float]:
    """CPU time of one `predict_table` call on `rows` rows of the window (1 torch thread), p50 / p99 ms."""
    import pyarrow as pa
    import torch

    table = pa.Table.from_pandas(frame, preserve_index=False)
    chunks = [table.slice((i * rows) % max(1, table.num_rows - rows), rows) for i in range(iterations)]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for c in chunks[:5]:
            predictor.predict_table(c)
        cpu = []
        for c in chunks:
            t = time.process_time()
            predictor.predict_table(c)
            cpu.append((time.process_time() - t) * 1e3)
    finally:
        torch.set_num_threads(before)
    return {f"cpu_p50_ms_b{rows}": float(np.percentile(cpu, 50)), f"cpu_p99_ms_b{rows}": float(np.percentile(cpu, 99))}


def summary(config, rows: dict[str, list[dict]]) -> str:
    """Per model: macro test NE and AUC per objective, mean over seeds (min..max when several)."""
    head = ["model"] + [f"NE {o}" for o in config.objective_names] + [f"AUC {o}" for o in config.objective_names]
    body = []
    for name, runs in rows.items():
        def fmt(key: str, o: str) -> str:
            v = np.array([r[key][o] for r in runs], float)
            return f"{v.mean():.4f}" + (f" ({v.min():.4f}..{v.max():.4f})" if len(v) > 1 else "")
        body.append([name] + [fmt("by_objective", o) for o in config.objective_names] + [fmt("auc", o) for o in config.objective_names])
    widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
    line = lambda r: "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in body])


def run_dataset(name: str, args) -> dict:
    from bench_peers import table, versus_lines, versus_reference

    from lattice.trees.fit import fit_trees

    workdir = Path(args.workdir) / name
    if name == "bank":
        config, paths = bank_table(workdir, args.bank_split)
    else:
        config, paths = shipped(name, workdir, args.reuse, args.demo_rows, args.set)
    config = config.model_copy(update={"training": config.training.model_copy(update={"num_workers": 0, "seed": args.seed})})
    # LightGBM on --tree-threads (1): OpenMP threads spinning on 2 shared, loaded cores made a
    # 60k-row fit take 273 s instead of ~30
    m = config.models
    trees = m.baselines.trees.model_copy(update={"num_threads": args.tree_threads})
    config = config.model_copy(update={"models": m.model_copy(update={"baselines": m.baselines.model_copy(update={"trees": trees})})})
    # the networks without leaves: the config's default has them on (since 2026-12-07)
    config = with_leaves(config, [], args.num_trees, args.num_leaves)
    on = with_leaves(config, ["teacher", "student"], args.num_trees, args.num_leaves, pooling=args.pooling)
    margin = with_leaves(config, ["teacher", "student"], args.num_trees, args.num_leaves, margin=("teacher", "student"),
                         pooling=args.pooling)
    # the student alone on the margin, distilled from the teacher with leaves (no margin)
    student_margin = with_leaves(config, ["teacher", "student"], args.num_trees, args.num_leaves, margin=("student",),
                                 pooling=args.pooling)
    def seeded(cfg, seed):
        return cfg.model_copy(update={"training": cfg.training.model_copy(update={"seed": seed})})

    def fit(cfg, share: float | str) -> dict:
        t = time.perf_counter()
        manifest = fit_trees(cfg, paths)
        auto = manifest.get("fit_share_auto")
        print(f"[{name}] trees fit (share {share}: {manifest['fit_rows']:,} of {manifest['train_rows']:,} train rows) "
              f"{time.perf_counter() - t:.0f}s: " + ", ".join(
                  f"{o} {b['best_round']} trees / {b['leaves']} leaves, optimism {b.get('optimism')}"
                  for o, b in manifest["boosters"].items()) + (f"; auto chose {auto['chose']:g}: {auto['why']}" if auto else ""),
              flush=True)
        return manifest

    if args.auto_only:  # what `fit_share: auto` chooses here, and the optimism it read
        m_auto = fit(with_leaves(config, ["teacher"], args.num_trees, args.num_leaves, fit_share="auto"), "auto")
        return {"fit_share_auto": m_auto["fit_share_auto"],
                "trees": {o: b["best_round"] for o, b in m_auto["boosters"].items()}}

    if args.both_networks:  # the usual config (leaves in both, the student on their margin) at share 1 and at auto
        from lattice.training.stages import score

        both: dict[str, list[dict]] = {}
        for share in (1.0, "auto") + (() if args.no_plain else (None,)):  # None: no leaves at all
            if share is None:
                cfg, tag = config, "none"
            else:
                cfg = with_leaves(config, ["teacher", "student"], args.num_trees, args.num_leaves, margin=("student",),
                                  pooling=args.pooling, fit_share=share)
                m_b = fit(cfg, share)
                tag = "auto" if share == "auto" else "1"
            for seed in args.seeds:
                print(f"[{name}] seed {seed}, both networks, fit share {tag}", flush=True)
                both.setdefault(f"teacher, share {tag}", []).append(run_one(seeded(cfg, seed), paths, f"teacher@b{tag}", args.epochs))
                scores = score(seeded(cfg, seed), paths, f"teacher@b{tag}", "all", progress=False)
                both.setdefault(f"student + margin, share {tag}", []).append(
                    run_one(seeded(cfg, seed), paths, f"student@b{tag}", args.epochs, teacher_scores=scores))
        for extra in args.others:  # e.g. separate: the student's share of the teacher's gain over it
            for seed in args.seeds:
                both.setdefault(extra, []).append(run_one(seeded(config, seed), paths, extra, args.epochs))
        print(f"\n[{name}] both networks read the leaves, the student on their margin (mean over seeds {args.seeds})\n"
              + table(config, both) + "\n", flush=True)
        if "separate" in both:  # the goal: the student keeps 90% of the teacher's gain over separate models
            mean = lambda rows, o: float(np.mean([r["by_objective"][o] for r in rows]))  # noqa: E731
            for o in config.objective_names:
                sep = mean(both["separate"], o)
                for tag in ("auto", "none"):
                    t, s_ = f"teacher, share {tag}", f"student + margin, share {tag}"
                    if t in both and s_ in both:
                        gain = sep - mean(both[t], o)
                        kept = (sep - mean(both[s_], o)) / gain if gain > 0 else float("nan")
                        print(f"  {o}, share {tag}: teacher's gain over separate {gain:+.4f}, the student keeps {kept:.0%}",
                              flush=True)
        # share "none": the networks without leaves (the student then has no margin either)
        found = {k: versus_reference(config, {r: v for r, v in both.items() if r.startswith(k)}, reference=f"{k}, share auto")
                 for k in ("teacher", "student + margin")}
        for f in found.values():
            print(f"paired intervals on seed {args.seeds[0]}'s test rows:\n" + versus_lines(f), flush=True)
        for runs in both.values():
            for r in runs:
                r.pop("test_predictions", None)
        return {"both_networks": both, "versus_share_1": found}

    rows: dict[str, list[dict]] = {}
    crossfit = {}
    for share in args.fit_shares:  # cross-fitting: the teacher with leaves of trees fitted on a share of the train rows
        if share != "auto" and share >= 1.0:
            continue
        xcfg = with_leaves(config, ["teacher"], args.num_trees, args.num_leaves, pooling=args.pooling, fit_share=share)
        m_x = fit(xcfg, share)
        crossfit[str(share)] = {o: b["best_round"] for o, b in m_x["boosters"].items()}
        for seed in args.seeds:
            print(f"[{name}] seed {seed}, fit share {share}", flush=True)
            tag = share if share == "auto" else round(share * 100)
            rows.setdefault(f"teacher, leaves, fit share {share}", []).append(
                run_one(seeded(xcfg, seed), paths, f"teacher@xfit{tag}", args.epochs))
    manifest = fit(on, 1.0)
    if args.latency_only:
        return {"leaf_latency": leaf_latency(config, paths), "trees": {o: b["best_round"] for o, b in manifest["boosters"].items()}}
    for seed in args.seeds:  # the trees are fitted once (seed --seed); the networks per seed
        print(f"[{name}] seed {seed}", flush=True)
        rows.setdefault("teacher, leaves", []).append(run_one(seeded(on, seed), paths, "teacher@leaves", args.epochs))
        if args.margin:
            rows.setdefault("teacher, leaves + margin", []).append(
                run_one(seeded(margin, seed), paths, "teacher@margin", args.epochs))
        if not args.no_plain:
            rows.setdefault("teacher", []).append(run_one(seeded(config, seed), paths, "teacher", args.epochs))
        for extra in args.others:
            rows.setdefault(extra, []).append(run_one(seeded(config, seed), paths, extra, args.epochs))
        if args.student:
            from lattice.training.stages import score

            pairs = [("teacher@leaves", on, "student@leaves", "student, leaves")]
            pairs += [("teacher@margin", margin, "student@margin", "student, leaves + margin"),
                      ("teacher@leaves", student_margin, "student@smargin", "student + margin, from teacher, leaves")
                      ] if args.margin else []
            pairs += [] if args.no_plain else [("teacher", config, "student", "student")]
            for teacher, cfg, student, label in pairs:
                scores = score(seeded(cfg, seed), paths, teacher, "all", progress=False)
                rows.setdefault(label, []).append(run_one(seeded(cfg, seed), paths, student, args.epochs, teacher_scores=scores))
        if seed == args.seeds[0]:  # deterministic boosters: once; the intervals are on this seed's rows
            if not args.no_boosters:
                rows["gbdt (platform)"] = [run_one(config, paths, "gbdt", None)]
                rows["LightGBM default"] = [run_one(lgb_default(config), paths, "gbdt@lgb_default", None)]
            found = versus_reference(config, rows, reference="teacher, leaves")
    print(f"\n[{name}] test NE per (domain, objective) and macro NE per objective (mean over seeds {args.seeds}; "
          f"leaves {args.num_trees} trees x {args.num_leaves} leaves)\n" + table(config, rows) + "\n", flush=True)
    print(summary(config, rows) + "\n", flush=True)
    if args.export_latency and args.student:
        found["export_latency"] = export_latency(config, paths, margin=args.margin)
    print(f"paired intervals on seed {args.seeds[0]}'s test rows:\n" + versus_lines(found), flush=True)
    for runs in rows.values():
        for r in runs:
            r.pop("test_predictions", None)
    return {"models": rows, "versus_teacher_leaves": found, "trees": {o: b["best_round"] for o, b in manifest["boosters"].items()},
            "trees_cross_fit": crossfit}


def compare_saved(name: str, args) -> dict:
    """`--compare REF=M1,M2`: NE(Mi) - NE(REF) per objective with the paired interval, on the test
    predictions the models left in the dataset's work folder (those of the last seed run)."""
    from bench_peers import versus_lines

    from lattice.evaluation.compare import paired_bootstrap
    from lattice.paths import Paths

    workdir = Path(args.workdir) / name
    if name == "bank":  # the cut only names the split in the config; the table is the one on disk
        config = bank_config(workdir, ("2009-01-01T00:00:00", "2010-01-01T00:00:00"))
        paths = Paths.for_config(config, workdir)
    else:
        config, paths = shipped(name, workdir, True, args.demo_rows, args.set)
    ref, others = args.compare.split("=", 1)
    a = pd.read_parquet(paths.model_dir(ref) / "predictions.parquet")
    pairs = {m: paired_bootstrap(config, a, pd.read_parquet(paths.model_dir(m) / "predictions.parquet"))["by_objective"]
             for m in others.split(",")}
    found = {"reference": ref, "pairs": pairs,
             "met": {o: not any(v[o]["verdict"] == "B better" for v in pairs.values()) for o in config.objective_names}}
    print(f"[{name}] " + versus_lines(found), flush=True)
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default="bank")
    p.add_argument("--workdir", default=str(ROOT / ".lattice" / "bench_tree_leaves"))
    p.add_argument("--epochs", type=int, default=None, help="default: each config's training.epochs")
    p.add_argument("--seed", type=int, default=0, help="the trees' seed")
    p.add_argument("--seeds", default="0", help="the networks' seeds, e.g. 0,1,2")
    p.add_argument("--bank-split", choices=["time", "hash"], default="time",
                   help="bank: time order (the issue's choice) or a seeded hash of the row (no drift, a contrast)")
    p.add_argument("--num-trees", type=int, default=50)
    p.add_argument("--num-leaves", type=int, default=15, help="models.leaves.num_leaves (its default: 15)")
    p.add_argument("--pooling", default=None, metavar="TEACHER[,STUDENT]",
                   help="models.leaves.pooling: mean or sum, for both networks or teacher,student (default: the config's)")
    p.add_argument("--fit-shares", default="1", metavar="S[,S...]",
                   help="models.leaves.fit_share: each share below 1 (or auto) also trains the teacher with leaves of trees fitted on "
                        "that share of the train rows (cross-fitting), against the reference teacher with leaves (share 1)")
    p.add_argument("--no-boosters", action="store_true", help="skip gbdt and LightGBM default")
    p.add_argument("--both-networks", action="store_true",
                   help="leaves in the teacher and the student, the student on their margin: share 1 against auto")
    p.add_argument("--auto-only", action="store_true",
                   help="fit the trees at fit_share: auto only, and print the optimism it read and the share it chose")
    p.add_argument("--compare", default=None, metavar="REF=M1,M2",
                   help="only compare: NE(Mi) - NE(REF) with the paired interval on the test predictions the models "
                        "(model dir names, e.g. teacher@leaves=teacher@xfit70,teacher) left in each dataset's work folder")
    p.add_argument("--latency-of", default=None, metavar="M1,M2",
                   help="only time these trained models' exports (5 alternating rounds), e.g. student,student@soft3,student@soft3m")
    p.add_argument("--student", action="store_true", help="also the students distilled from each teacher")
    p.add_argument("--margin", action="store_true", help="also the teacher (and student) with models.leaves.margin")
    p.add_argument("--no-plain", action="store_true", help="skip the teacher (and student) without leaves")
    p.add_argument("--others", default="", help="more platform models on the same rows, e.g. mmoe,separate")
    p.add_argument("--tree-threads", type=int, default=1, help="LightGBM threads of every fit")
    p.add_argument("--out", default=str(ROOT / ".lattice" / "bench" / "bench_tree_leaves.json"))
    p.add_argument("--export-latency", action="store_true", help="with --student: export both students, time single requests")
    p.add_argument("--latency-only", action="store_true", help="fit the trees and time their leaf ids per request only")
    p.add_argument("--demo-rows", type=int, default=60_000)
    p.add_argument("--reuse", action="store_true", help="keep a training set already built in the work folder")
    p.add_argument("--set", action="append", default=[], help="config override K=V for the shipped configs")
    args = p.parse_args()
    args.others = [m for m in args.others.split(",") if m]
    args.seeds = [int(x) for x in args.seeds.split(",")]
    args.fit_shares = [x if x == "auto" else float(x) for x in args.fit_shares.split(",")]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}, "
          f"load avg {os.getloadavg()[0]:.1f}", flush=True)
    if args.compare:
        for name in args.datasets.split(","):
            compare_saved(name, args)
        return
    if args.latency_of:  # students already trained in the dataset's work folder (e.g. by bench_distill_weight)
        for name in args.datasets.split(","):
            config, paths = shipped(name, Path(args.workdir) / name, True, args.demo_rows, args.set)
            export_latency(config, paths, rounds=5, models=tuple(args.latency_of.split(",")))
        return
    out = {name: run_dataset(name, args) for name in args.datasets.split(",")}
    dest = Path(args.out)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=2, default=str))
    print(f"figures written to {dest}")


if __name__ == "__main__":
    main()
