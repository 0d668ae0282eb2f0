"""A simulated market lived day by day (issues 34 and 35): retraining, backfill, monitoring.

The moving demo market (`bench/configs/demo_market.yaml`: new ids every day, click drift, a shock
to one domain's clicks on `--shock-day`, 30% of conversions logged 1-7 days late with their own
time, date-partitioned raw logs), tiny model sizes (`lattice.training.tiny`), run forward in time
through the stage functions the DAGs' tasks call (`lattice.stages.run_stage`: features, train,
distill with export and registration, promote, predict, monitor), one process.

The first days (before anything is trained, judged or served) may run in one features run over
their interval (`--warmup-in-one-run`; tests/integration/test_pipeline_demo.py: the same tables).

(A) issue 34. Every day t from `--first` on, after day t's features run: (a) the teacher
    warm-started from yesterday's (`warm_start: last`) and (b) a from-scratch teacher on the
    trailing `--window`, both with the window ending before day t (validation t-1, test t), then
    the student distilled from (a) (from scratch on the window; `--student-warm-start last`:
    continued from the last student on the days it has not seen), exported, registered and
    gated on day t; the promoted student's next-day NE is the gate's (challenger when promoted,
    else the champion it kept). Per day and cell: next-day NE of (a), (b), (c); means over the
    judged days: (a)/(b) per cell, examples processed (a)/(b), student/teacher.
(B) backfill idempotence. After the forward run, 3 days drawn with `--seed` are re-run through
    the features stage; the consolidated partitions, aggregates, training-set days (file rows,
    order-free hashes) and the online store's values for every entity are compared before and
    after, and every run's rows reconcile (raw rows in = consolidated + quarantined).
(C) issue 35 (separate serving workdir `serve/`, sharing the tables of (A)'s run by symlink):
    a champion trained once on the first window is served; every day its impressions are sent
    to `lattice serve --replay-clock` over HTTP in batches of 256, logged at that simulated day's
    noon (`X-Lattice-Logged-At`; `--scoring predict`: through `lattice predict --logged-at`, the
    same log schema), then, after the day's features run, `lattice monitor`
    runs with the day's labels joined. A tripped rule starts a warm-start retrain (train, distill,
    promote) as the `retrain` asset would. Reports the day the shocked cell is flagged, its
    calibration on the days after the retrain and the trips on shock-free days (before the shock;
    `--no-shock --market-seed N --parts C` lives a shock-free market for the false-alarm count).

    nice -n 10 .venv/bin/python bench/bench_market_life.py --days 21 --rows-per-day 5000 --warmup-in-one-run --parts A,B,C

Prints tables (markdown) and asserts nothing; `--json` writes every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CELLS = ["feed/click", "feed/conversion", "search/click", "search/conversion", "video/click"]


@contextlib.contextmanager
def quiet():
    """The stages' own prints (plans, notes) off the bench's tables."""
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        yield


def build_config(args, seed: int, shock: bool, base: Path):
    from lattice.config import load_config
    from lattice.config.monitoring import CalibrationRule
    from lattice.config.timing import Zipper
    from lattice.training.tiny import tiny

    cfg = load_config(ROOT / "bench" / "configs" / "demo_market.yaml")
    start = cfg.time_range.start
    own = cfg.models
    cfg = tiny(cfg, data_root=str(base / "raw"), batch_size=256)
    if args.sizes == "config":  # the config's teacher and student (the demo's pair) on the same tiny market and tables
        cfg = cfg.model_copy(update={"models": cfg.models.model_copy(update={"teacher": own.teacher, "student": own.student})})
    if args.leaves:  # the config's leaf features (tiny() turns them off): the trees fitted per day on its window
        cfg = cfg.model_copy(update={"models": cfg.models.model_copy(update={"leaves": own.leaves})})
    market = cfg.synthetic.market
    sh = market.shock.model_copy(update={"day": args.shock_day}) if shock and market.shock else None
    cfg = cfg.model_copy(update={
        "time_range": cfg.time_range.model_copy(update={"end": start + dt.timedelta(days=args.days)}),
        "synthetic": cfg.synthetic.model_copy(update={
            "days": args.days, "seed": seed, "market": market.model_copy(update={"shock": sh})}),
        "training": cfg.training.model_copy(update={"window": args.window, "epochs": args.epochs, "nproc": 1,
                                                    "label_delay": args.label_delay, "replay": args.replay,
                                                    "replay_rows": args.replay_rows,
                                                    "zipper": (Zipper(windows=args.zipper_windows.split(","),
                                                                      shares=([float(x) for x in args.zipper_shares.split(",")]
                                                                              if args.zipper_shares else None))
                                                               if args.label_delay == "zipper" else cfg.training.zipper),
                                                    "window_validation": args.window_validation,
                                                    "refresh_every": args.refresh_every}),
        "monitoring": cfg.monitoring.model_copy(update={**({"retrain_validation_share": args.retrain_validation_share}
                                                  if args.retrain_validation_share is not None else {}), "rules": [
            CalibrationRule(kind="calibration", low=args.cal_low, high=args.cal_high,
                            min_positives=args.min_positives, periods=args.periods,
                            confidence=args.cal_confidence)]}),
    })
    floors = {k: v for k, v in (("max_ne", args.first_max_ne), ("min_auc", args.first_min_auc)) if v is not None}
    if floors:
        p = cfg.promotion
        cfg = cfg.model_copy(update={"promotion": p.model_copy(update={"floors": p.floors.model_copy(update=floors)})})
    return cfg


def day(cfg, k: int) -> dt.date:
    """Day k (0-based) of the market."""
    return cfg.time_range.start + dt.timedelta(days=k)


def cells_of(metrics: dict) -> dict[str, float]:
    from lattice.registry.stages import per_cell

    return {c: float(m["ne"]) for c, m in per_cell(metrics).items()}


class Life:
    """One market's workdir and its forward run."""

    def __init__(self, args, cfg, base: Path):
        from lattice.paths import Paths

        self.args, self.cfg, self.base = args, cfg, base
        self.paths = Paths.for_config(cfg, base / "work")
        self.feature_runs: dict[str, dict] = {}

    def synth(self) -> dict:
        from lattice.stages import run_stage

        with quiet():
            return run_stage("synth", self.cfg, self.paths, rows=self.args.days * self.args.rows_per_day, progress=False)

    def features(self, k: int, until: int | None = None) -> dict:
        """Day k's features run (days k .. until-1 in one run over their interval with `until`)."""
        from lattice.stages import run_stage

        t = time.perf_counter()
        with quiet():
            s = run_stage("features", self.cfg, self.paths, start=str(day(self.cfg, k)), end=str(day(self.cfg, until or k + 1)))
        s["wall"] = time.perf_counter() - t
        name = str(day(self.cfg, k)) if until is None else f"{day(self.cfg, k)}..{day(self.cfg, until - 1)}"
        self.feature_runs.setdefault(name, []).append(s)
        return s


# ---------------------------------------------------------------- (A) retraining every day


def train_round(cfg, paths, end: str, first: bool, scratch: bool, student_warm: str = "none",
                validation_share: float | None = None) -> dict:
    """One day's teacher chain: warm teacher (or the first window's), from-scratch teacher, student
    distilled, exported and registered, then the next-day gate. `validation_share`: what a retrain
    a rule started holds out of its newest day (the DAG passes monitoring.retrain_validation_share;
    the student follows its teacher's lineage)."""
    from lattice.stages import run_stage
    from lattice.trees.fit import fit_trees_if_on

    out: dict = {"end": end}
    t = time.perf_counter()
    with quiet():
        # the teacher DAG's first step: the leaf features' trees of this window (models.leaves)
        fit_trees_if_on(cfg, paths, end=end, validation_share=validation_share)
        s = run_stage("train", cfg, paths, model="teacher", end=end, warm_start="none" if first else "last", progress=False,
                      validation_share=validation_share)
    m = json.loads((paths.model_dir("teacher") / "metrics.json").read_text())
    out["warm"] = {"cells": cells_of(m), "macro": m["macro"]["ne"], "examples": sum(e["examples"] for e in s["history"]),
                   "trained": s["lineage"]["trained_days"], "seconds": time.perf_counter() - t}
    run_stage("evaluate", cfg, paths, model="teacher")
    if scratch:
        t = time.perf_counter()
        with quiet():
            s = run_stage("train", cfg, paths, model="teacher@scratch", end=end, warm_start="none", progress=False)
        m = json.loads((paths.model_dir("teacher@scratch") / "metrics.json").read_text())
        out["scratch"] = {"cells": cells_of(m), "macro": m["macro"]["ne"],
                          "examples": sum(e["examples"] for e in s["history"]), "seconds": time.perf_counter() - t}
    t = time.perf_counter()
    with quiet():
        d = run_stage("distill", cfg, paths, end=end, progress=False, register=True, export=True,
                      warm_start="none" if first else student_warm)
    m = json.loads((paths.model_dir("student") / "metrics.json").read_text())
    out["student"] = {"cells": cells_of(m), "macro": m["macro"]["ne"], "seconds": time.perf_counter() - t,
                      "version": d["student"]["version"]}
    t = time.perf_counter()
    g = run_stage("promote", cfg, paths)
    ms = g["measurements"]
    take = "challenger" if g["passed"] else "champion"
    out["gate"] = {"passed": g["passed"], "judged_on": g.get("judged_on"), "champion_after": g["champion_after"],
                   "failed": [r["message"] for r in g["reasons"] if not r["passed"]],
                   "promoted_cells": {c: ms.get(f"{take}.{c.replace('/', '.')}.ne") for c in CELLS},
                   "seconds": time.perf_counter() - t}
    return out


def part_a(life: Life, report: dict) -> None:
    args, cfg, paths = life.args, life.cfg, life.paths
    rounds: dict[str, dict] = {}
    walls: dict[str, float] = {}
    print(f"\n## (A) retraining every day: window {args.window}, first judged day {args.first}\n")
    print("| test day | features s | warm macro NE | scratch macro NE | student macro NE | gate | warm ex | scratch ex | warm trained | train s (warm/scratch/student+gate) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    warm = max(0, args.first - 2) if args.warmup_in_one_run else 0
    if warm:
        f = life.features(0, warm)
        print(f"| {day(cfg, 0)} .. {day(cfg, warm - 1)} (days 1-{warm}, one run over their interval) | {f['wall']:.0f} | | | | features only | | | | |", flush=True)
    for k in range(warm, args.days):
        if args.serve_hook:
            args.serve_hook(k, "before_features")
        f = life.features(k)
        date = str(day(cfg, k))
        walls[date] = f["wall"]
        if args.serve_hook:
            args.serve_hook(k, "after_features")
        t1 = k + 1  # 1-based day
        if t1 < args.first - 1:
            print(f"| {date} (day {t1}) | {f['wall']:.0f} | | | | features only | | | | |", flush=True)
            continue
        first = t1 == args.first - 1
        r = train_round(cfg, paths, end=date, first=first, scratch=not first, student_warm=args.student_warm_start)
        rounds[date] = r
        g = r["gate"]
        sc = r.get("scratch")
        print(f"| {date} (day {t1}) | {f['wall']:.0f} | {r['warm']['macro']:.4f} | {sc['macro'] if sc else float('nan'):.4f} | "
              f"{r['student']['macro']:.4f} | {'promoted v' + str(g['champion_after']) if g['passed'] else 'kept v' + str(g['champion_after'])} | "
              f"{r['warm']['examples']:,} | {sc['examples'] if sc else 0:,} | {','.join(d[5:] for d in r['warm']['trained'])} | "
              f"{r['warm']['seconds']:.0f}/{sc['seconds'] if sc else 0:.0f}/{r['student']['seconds'] + g['seconds']:.0f} |", flush=True)
        if g["failed"]:
            print(f"|   gate: {'; '.join(g['failed'])[:300]} |")
    report["A"] = {"rounds": rounds, "features_wall": walls}
    judged = [r for d, r in rounds.items() if "scratch" in r]
    print(f"\n### next-day NE per cell, means over the {len(judged)} judged days ({min(d for d, r in rounds.items() if 'scratch' in r)} .. {max(rounds)})\n")
    print("| cell | warm (a) | scratch (b) | (a)/(b) | goal <= 1.002 | student | promoted (c) | student/teacher | goal <= 1.01 | (a) better on |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    summary = {}
    for c in CELLS:
        a = [r["warm"]["cells"][c] for r in judged]
        b = [r["scratch"]["cells"][c] for r in judged]
        s = [r["student"]["cells"][c] for r in judged]
        p = [r["gate"]["promoted_cells"][c] for r in judged if r["gate"]["promoted_cells"].get(c) is not None]
        ma, mb, msd = sum(a) / len(a), sum(b) / len(b), sum(s) / len(s)
        mp = sum(p) / len(p) if p else float("nan")
        better = sum(x < y for x, y in zip(a, b))
        summary[c] = {"warm": ma, "scratch": mb, "ratio": ma / mb, "student": msd, "promoted": mp, "student_over_teacher": msd / ma}
        print(f"| {c} | {ma:.4f} | {mb:.4f} | {ma / mb:.4f} | {'yes' if ma / mb <= 1.002 else 'no'} | {msd:.4f} | {mp:.4f} | "
              f"{msd / ma:.4f} | {'yes' if msd / ma <= 1.01 else 'no'} | {better}/{len(a)} |")
    ea = sum(r["warm"]["examples"] for r in judged)
    eb = sum(r["scratch"]["examples"] for r in judged)
    sa = sum(r["warm"]["seconds"] for r in judged)
    sb = sum(r["scratch"]["seconds"] for r in judged)
    print(f"\nexamples processed: warm {ea:,} / scratch {eb:,} = {ea / eb:.3f} (goal <= 0.333); train seconds {sa:.0f} / {sb:.0f}")
    promoted = sum(r["gate"]["passed"] for r in judged)
    print(f"students promoted: {promoted}/{len(judged)} judged days")
    report["A"]["summary"] = {"cells": summary, "examples_warm": ea, "examples_scratch": eb, "promoted": promoted,
                              "judged_days": len(judged)}


# ---------------------------------------------------------------- (B) backfill idempotence


def _table_digest(folder: Path) -> dict[str, tuple[int, str]]:
    """Per partition folder: (rows, hash of its rows sorted), independent of file names and order."""
    import pyarrow.parquet as pq

    out: dict[str, tuple[int, str]] = {}
    if not folder.exists():
        return out
    parts: dict[Path, list[Path]] = {}
    for f in sorted(folder.rglob("*.parquet")):
        if any(p.startswith(".") or p.startswith("_") for p in f.relative_to(folder).parts):
            continue
        parts.setdefault(f.parent, []).append(f)
    for part, files in sorted(parts.items()):
        frames = [pq.read_table(f).to_pandas() for f in files]
        import pandas as pd

        df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        if df.empty:
            out[str(part.relative_to(folder))] = (0, "")
            continue
        df = df[sorted(df.columns)]
        rows = sorted(hashlib.sha1(r.encode()).hexdigest() for r in df.astype(str).agg("\x1f".join, axis=1))
        out[str(part.relative_to(folder))] = (len(df), hashlib.sha1("".join(rows).encode()).hexdigest())
    return out


def _online_digest(cfg, paths) -> tuple[int, str]:
    """Every entity's online aggregate values, read as `lattice predict` and serving read them."""
    import numpy as np
    import pyarrow.dataset as ds
    from lattice.scoring.batch import _online_aggregates

    cons = ds.dataset(str(paths.consolidated), format="parquet", partitioning="hive",
                      exclude_invalid_files=True).to_table(columns=["user_id", "ad_id"]).to_pandas()
    rows = cons.drop_duplicates().sort_values(["user_id", "ad_id"]).reset_index(drop=True)
    values, unknown = _online_aggregates(cfg, paths, rows)
    h = hashlib.sha1()
    for k in sorted(values):
        h.update(k.encode())
        h.update(np.round(np.asarray(values[k], np.float64), 9).tobytes())
    h.update(repr(unknown).encode())
    return len(rows), h.hexdigest()


def part_b(life: Life, report: dict) -> None:
    args, cfg, paths = life.args, life.cfg, life.paths
    rng = random.Random(args.seed)
    chosen = sorted(rng.sample(range(args.days), 3))
    tables = {"consolidated": paths.consolidated, "quarantine": paths.quarantine, "aggregates": paths.aggregates,
              "training_set": paths.training_set}
    before = {k: _table_digest(v) for k, v in tables.items()}
    online_before = _online_digest(cfg, paths)
    print(f"\n## (B) backfill: days {', '.join(str(day(cfg, k)) for k in chosen)} re-run (seed {args.seed})\n")
    reruns = {}
    for k in chosen:
        reruns[str(day(cfg, k))] = life.features(k)["wall"]
    after = {k: _table_digest(v) for k, v in tables.items()}
    online_after = _online_digest(cfg, paths)
    print("| table | partitions | rows | identical partitions | differing |")
    print("|---|---|---|---|---|")
    result = {}
    for k in tables:
        b, a = before[k], after[k]
        same = sum(1 for p in set(b) | set(a) if b.get(p) == a.get(p))
        diff = sorted(p for p in set(b) | set(a) if b.get(p) != a.get(p))
        rows = sum(r for r, _ in a.values())
        result[k] = {"partitions": len(a), "rows": rows, "identical": same, "differing": diff}
        print(f"| {k} | {len(a)} | {rows:,} | {same}/{len(set(b) | set(a))} | {', '.join(diff[:4]) or '-'} |")
    print(f"| online store (every entity of the consolidated table) | | {online_after[0]:,} | "
          f"{'identical' if online_before == online_after else 'DIFFERENT'} | |")
    print("\n| day | raw rows read | consolidated | quarantined | in = out + quarantined |")
    print("|---|---|---|---|---|")
    recon = {}
    for date, runs in sorted(life.feature_runs.items()):
        for i, s in enumerate(runs):
            raw = s.get("raw_rows_read")
            tot = s["stages"]["consolidate"]["totals"]
            good, bad = tot.get("rows_out"), tot.get("quarantined", 0)
            ok = raw is not None and good is not None and raw == good + bad + tot.get("skipped", 0) and tot.get("balanced", True)
            recon.setdefault(date, []).append({"raw": raw, "out": good, "quarantined": bad, "ok": ok, "totals": tot})
            mark = " (re-run)" if i else ""
            print(f"| {date}{mark} | {raw} | {good} | {bad} | {'yes' if ok else 'NO'} |")
    report["B"] = {"days": [str(day(cfg, k)) for k in chosen], "tables": result,
                   "online_identical": online_before == online_after, "online_rows": online_after[0],
                   "reconcile": recon}


# ---------------------------------------------------------------- (C) serving, monitoring, triggered retraining

TABLES = ("consolidated", "quarantine", "aggregates", "training_set", "feast", "validation")


class Serving:
    """(C): a served champion in its own workdir (models, registry, prediction log, monitoring)
    over the forward run's tables (symlinked), retrained only when a monitoring rule trips."""

    def __init__(self, life: Life, report: dict, name: str = "C"):
        from lattice.paths import Paths

        self.life, self.cfg, self.args, self.name = life, life.cfg, life.args, name
        self.paths = Paths(workdir=(life.base / "serve").resolve(), data_root=life.paths.data_root)
        self.paths.workdir.mkdir(parents=True, exist_ok=True)
        for t in TABLES:
            (self.paths.workdir / t).symlink_to(life.paths.workdir / t, target_is_directory=True)
        self.report = report.setdefault(name, {"days": {}, "retrains": []})
        self.served = False
        self.broken: str | None = None
        self.retrain_on: int | None = None  # the day (0-based) whose features run starts the triggered retrain
        self.version: int | None = None
        self.server = None  # `lattice serve --replay-clock` (--scoring http), started with the first champion

    def close(self) -> None:
        """A clean stop of the server: it writes every acknowledged log record."""
        if self.server is not None:
            self.server.terminate()
            self.server.wait(timeout=60)
            self.server = None

    def _serve(self) -> str:
        """The server's URL, started on first use over this workdir, serving the registry's
        champion (a promotion is picked up within its poll interval)."""
        import subprocess

        import httpx
        import yaml

        url = f"http://127.0.0.1:{self.args.port}"
        if self.server is None:
            cfg_file = self.paths.workdir / "market.yaml"
            cfg_file.write_text(yaml.safe_dump(self.cfg.model_dump(mode="json"), sort_keys=False))
            self.server = subprocess.Popen(
                [sys.executable, "-m", "lattice.cli", "serve", str(cfg_file), "--workdir", str(self.paths.workdir),
                 "--port", str(self.args.port), "--replay-clock", "--poll-seconds", "0.5", "--log-level", "warning"], cwd=ROOT)
            import atexit

            atexit.register(self.close)  # a bench that stops on an error leaves no server behind
            sys.path.insert(0, str(ROOT / "bench"))
            from bench_serving import wait_healthy

            wait_healthy(url, self.server, 300)
        deadline = time.time() + 60  # a promotion since the last day: wait for the server to swap to it
        while httpx.get(url + "/metadata").json().get("model_version") != self.version:
            if time.time() > deadline:
                raise RuntimeError(f"the server did not load champion v{self.version}")
            time.sleep(0.25)
        return url

    def _post_day(self, frame, date: str, out: Path) -> int:
        """The day's parsed rows as /predict batches of 256, logged at noon of that day; the
        answers to `out` (example_id, domain, p_<objective>: what `lattice predict` writes)."""
        import httpx
        import pandas as pd

        from lattice.data import schema as S

        cfg = self.cfg
        entity = [f.column for f in cfg.entity_features]
        sparse = [c for c in S.sparse_columns(cfg) if c not in entity and c in frame]
        dense = [c for c in S.dense_columns(cfg) if c in frame]
        keys = [k for k in S.passthrough_columns(cfg) if k in frame]
        reqs = []
        for r in frame.to_dict("records"):
            feats = {c: int(r[c]) for c in sparse if not pd.isna(r[c])}
            feats.update({c: float(r[c]) for c in dense if r.get(S.present_column(c), 1) == 1 and not pd.isna(r[c])})
            req = {"request_id": str(r["example_id"]), "domain": r["domain"],
                   "entities": {k: int(r[k]) for k in entity}, "features": feats}
            if keys:
                req["passthrough"] = {k: str(r[k]) for k in keys if not pd.isna(r[k])}
            reqs.append(req)
        url = self._serve()
        answers = []
        with httpx.Client(timeout=120) as client:
            for i in range(0, len(reqs), 256):
                r = client.post(url + "/predict", json={"requests": reqs[i:i + 256]},
                                headers={"X-Lattice-Logged-At": f"{date}T12:00:00Z"})
                if r.status_code != 200:
                    raise RuntimeError(f"/predict answered {r.status_code}: {r.text[:300]}")
                answers += [{"example_id": a["request_id"], "domain": a["domain"],
                             **{f"p_{o}": v for o, v in a["probabilities"].items()}} for a in r.json()["predictions"]]
        out.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(answers).to_parquet(out, index=False)
        return len(reqs)

    def _flush_log(self) -> None:
        """The server's log on disk before the monitor reads it: its writer flushes at least
        every `flush_seconds`; a stop and restart would also do, at a model load's cost."""
        time.sleep(self.cfg.monitoring.prediction_log.flush_seconds + 1.0)

    def hook(self, k: int, when: str) -> None:
        if self.broken:
            return
        try:
            if when == "before_features":
                self.score(k)
            else:
                self.after(k)
        except Exception as exc:  # noqa: BLE001 - (A) goes on; (C) says where it stopped
            import traceback

            traceback.print_exc()
            self.broken = f"day {day(self.cfg, k)} {when}: {type(exc).__name__}: {exc}"
            self.report["broken"] = self.broken
            print(f"[{self.name}] stopped: {self.broken}", flush=True)

    def score(self, k: int) -> None:
        """Day k's impressions through the champion before day k's features run (the online store
        holds day k-1's aggregates then, as it would while day k is served)."""
        from lattice.stages import run_stage

        if not self.served:
            return
        date = str(day(self.cfg, k))
        out = self.paths.workdir / "scored"
        n = 0
        t = time.perf_counter()
        for src in self.cfg.sources:
            folder = self.paths.data_root / src.domain / f"date={date}"
            if not folder.exists():
                continue
            if self.args.scoring == "http":  # through `lattice serve`, as a day of traffic
                from pipelines.score_input import parse_input

                with quiet():
                    good, _, _ = parse_input(self.cfg, str(folder), src.name)
                n += self._post_day(good, date, out / f"{date}-{src.domain}.parquet")
                continue
            with quiet():
                r = run_stage("predict", self.cfg, self.paths, input=str(folder), output=str(out / f"{date}-{src.domain}.parquet"),
                              model="champion", source=src.name, logged_at=f"{date}T12:00")
            n += r["logged"]
        if self.args.scoring == "http":
            self._flush_log()
        self.report["days"].setdefault(date, {})["scored"] = {"rows": n, "version": self.version,
                                                              "seconds": round(time.perf_counter() - t, 1)}

    def after(self, k: int) -> None:
        from lattice.stages import run_stage

        args, cfg = self.args, self.cfg
        date = str(day(cfg, k))
        queued: int | None = None  # the day a retrain this day's trips start runs after
        if k == args.first - 2:  # the first window's champion (test day k)
            first_cfg = cfg
            if args.first_calibration:  # the first model's gate only: later gates keep the config's bounds
                low, high = (float(x) for x in args.first_calibration.split(","))
                first_cfg = cfg.model_copy(update={"promotion": cfg.promotion.model_copy(update={"calibration": (low, high)})})
            r = train_round(first_cfg, self.paths, end=date, first=True, scratch=False)
            self.served = r["gate"]["passed"]
            self.version = r["gate"]["champion_after"]
            self.report["retrains"].append({"after_day": date, "why": "first window", **r["gate"]})
            print(f"[{self.name}] first champion v{self.version} (gate {'passed' if self.served else 'FAILED: ' + '; '.join(r['gate']['failed'])})", flush=True)
            return
        rec = self.report["days"].setdefault(date, {})
        if self.served and "scored" in rec:
            t = time.perf_counter()
            m = run_stage("monitor", cfg, self.paths, end=str(day(cfg, k + 1)), lookback_days=7, period="day", mlflow=False)
            cells = {f"{c['domain']}/{c['objective']}": c for c in m["cells"]
                     if c["period"] == date and c["model_version"] == rec["scored"]["version"]}
            rec["calibration"] = {c: v.get("calibration") for c, v in cells.items()}
            rec["positives"] = {c: v.get("positives") for c, v in cells.items()}
            rec["tripped"] = [{"cell": f"{x.get('domain')}/{x.get('objective')}", "rule": x.get("kind", x.get("rule")),
                               "reason": x.get("reason")} for x in m["tripped"]]
            rec["needs_person"] = [f"{x.get('domain')}/{x.get('objective')}" for x in m["needs_person"]]
            rec["monitor_seconds"] = round(time.perf_counter() - t, 1)
            shock = cfg.synthetic.market.shock
            tag = f"{shock.domain}/click" if shock and shock.domain else None
            cal = " ".join(f"{c}={v:.3f}" if v == v and v is not None else f"{c}=-" for c, v in sorted(rec["calibration"].items()))
            print(f"[{self.name}] {date} v{rec['scored']['version']}: {cal}; tripped {[t['cell'] for t in rec['tripped']]}"
                  f"{'; needs a person ' + str(rec['needs_person']) if rec['needs_person'] else ''}", flush=True)
            if rec["tripped"] and self.retrain_on in (None, k):
                # a trip on the day a retrain already runs after (one started by an earlier trip) is a
                # new asset event: Airflow queues its run behind the running one (max one active run)
                queued = k + 1
                rec["retrain_started"] = True
        if self.retrain_on == k:
            # the retrain asset's chain: warm teacher on the days since the champion's, student, next-day gate on day k
            r = train_round(cfg, self.paths, end=date, first=False, scratch=False, student_warm=self.args.student_warm_start,
                            validation_share=cfg.monitoring.retrain_validation_share)
            self.retrain_on = None
            if r["gate"]["passed"]:
                self.version = r["gate"]["champion_after"]
            self.report["retrains"].append({"after_day": date, "why": "rule tripped", "trained": r["warm"]["trained"], **r["gate"]})
            print(f"[{self.name}] retrain after {date}: trained {r['warm']['trained']}, gate "
                  f"{'promoted v' + str(self.version) if r['gate']['passed'] else 'rejected: ' + '; '.join(r['gate']['failed'])}",
                  flush=True)
        if queued is not None:
            self.retrain_on = queued

    def summarize(self) -> dict:
        cfg, args = self.cfg, self.args
        shock = cfg.synthetic.market.shock
        days = self.report["days"]
        s_date = str(day(cfg, shock.day)) if shock else None
        trips = [(d, t["cell"]) for d, r in sorted(days.items()) for t in r.get("tripped", [])]
        false = [(d, c) for d, c in trips if s_date is None or d < s_date]
        out: dict = {"trips": trips, "false_alarms": false,
                     "shock_free_days": sum(1 for d, r in days.items() if "calibration" in r and (s_date is None or d < s_date))}
        print(f"\n### ({self.name}) served market, seed {cfg.synthetic.seed}, shock {shock}\n")
        cols = sorted({c for r in days.values() for c in r.get("calibration", {})})
        print("| day | served by | " + " | ".join(cols) + " | tripped | needs a person |")
        print("|---|---|" + "---|" * len(cols) + "---|---|")
        for d, r in sorted(days.items()):
            if "calibration" not in r:
                continue
            cal = " | ".join(f"{r['calibration'].get(c):.3f}" if r["calibration"].get(c) is not None else "-" for c in cols)
            mark = " (shock)" if s_date and d == s_date else ""
            print(f"| {d}{mark} | v{r['scored']['version']} | {cal} | {', '.join(t['cell'] for t in r['tripped']) or '-'} | "
                  f"{', '.join(r['needs_person']) or '-'} |")
        if shock and shock.domain:
            cell = f"{shock.domain}/click"
            flagged = next((d for d, c in trips if c == cell and d >= s_date), None)
            out["shocked_cell"] = cell
            out["flagged_on"] = flagged
            out["flag_delay_days"] = (dt.date.fromisoformat(flagged) - dt.date.fromisoformat(s_date)).days if flagged else None
            retrain = next((r for r in self.report["retrains"] if r["why"] == "rule tripped" and flagged and r["after_day"] > flagged), None)
            back = None
            if retrain and retrain["passed"]:
                after = [(d, r["calibration"].get(cell)) for d, r in sorted(days.items())
                         if "calibration" in r and d > retrain["after_day"] and r["scored"]["version"] == retrain["champion_after"]]
                out["after_retrain"] = after
                back = next((d for d, v in after if v is not None and 0.95 <= v <= 1.05), None)
            out["retrain"] = retrain
            out["back_in_bounds_on"] = back
            print(f"\nshock on {s_date} ({cell}): flagged on {flagged} ({out['flag_delay_days']} day(s) after the shock day; its click "
                  f"labels are consolidated by that day's features run); retrain: "
                  f"{(retrain['after_day'] + ', trained ' + ','.join(retrain['trained']) + (', promoted v' + str(retrain['champion_after']) if retrain['passed'] else ', rejected')) if retrain else 'none'}; "
                  f"calibration back in [0.95, 1.05] on: {back}")
        print(f"false alarms (trips before the shock / on a shock-free market): {len(false)} over {out['shock_free_days']} monitored shock-free days {false or ''}")
        out["truth"] = truth_verdicts(self.paths.workdir, self.report, args.cal_low, args.cal_high)
        print_truth(out["truth"], args.cal_low, args.cal_high)
        if out.get("after_retrain"):  # the same question without the labels' sampling noise
            true = out["truth"]["true_calibration"]
            out["after_retrain_truth"] = [(d, round(true.get(d, {}).get(out["shocked_cell"], float("nan")), 3)) for d, _ in out["after_retrain"]]
            out["back_in_bounds_by_truth_on"] = next((d for d, v in out["after_retrain_truth"] if 0.95 <= v <= 1.05), None)
            print(f"{out['shocked_cell']} after the retrain against the truth: {out['after_retrain_truth']}; "
                  f"back in [0.95, 1.05] on {out['back_in_bounds_by_truth_on']}")
        self.report["summary"] = out
        return out


def true_calibration(serve: Path, date: str) -> dict[str, float]:
    """Per click cell, the served model's calibration against the market's truth on day `date`:
    sum of the served p / sum of the true p over the day's impressions (`scored/`, joined on
    example_id with the consolidated rows' `truth_click`). Unlike the monitor's ratio (sum p / sum
    of labels) it has almost no sampling noise, so it tells a real miscalibration from noise."""
    import pandas as pd

    files = sorted((serve / "scored").glob(f"{date}-*.parquet"))
    folder = serve / "consolidated" / f"date={date}"
    if not files or not folder.exists():
        return {}
    scored = pd.concat([pd.read_parquet(f, columns=["example_id", "domain", "p_click"]) for f in files])
    truth = pd.read_parquet(folder, columns=["example_id", "truth_click"])
    j = scored.merge(truth, on="example_id")
    return {f"{d}/click": float(g["p_click"].sum() / g["truth_click"].sum()) for d, g in j.groupby("domain") if g["truth_click"].sum() > 0}


def truth_verdicts(serve: Path, report_c: dict, low: float, high: float) -> dict:
    """Each trip judged against the truth (`real`: the served model's true calibration is outside
    [low, high] that day; `noise` otherwise), and the misses: days a click cell's true calibration
    was outside with no trip."""
    days = report_c["days"]
    true = {d: true_calibration(serve, d) for d, r in sorted(days.items()) if "calibration" in r}
    trips = [(d, t["cell"]) for d, r in sorted(days.items()) for t in r.get("tripped", [])]
    verdict = [(d, c, round(true.get(d, {}).get(c, float("nan")), 3),
                "real" if not low <= true.get(d, {}).get(c, 1.0) <= high else "noise") for d, c in trips]
    tripped = set(trips)
    misses = [(d, c, round(v, 3)) for d, cells in true.items() for c, v in sorted(cells.items())
              if not low <= v <= high and (d, c) not in tripped]
    return {"true_calibration": true, "trips": verdict, "misses": misses}


def print_truth(t: dict, low: float, high: float) -> None:
    cells = sorted({c for v in t["true_calibration"].values() for c in v})
    print(f"\nthe served model's calibration against the market's truth (sum p / sum true p; outside [{low}, {high}] in bold)\n")
    print("| day | " + " | ".join(cells) + " |")
    print("|---|" + "---|" * len(cells))
    for d, v in t["true_calibration"].items():
        print(f"| {d} | " + " | ".join((f"**{v[c]:.3f}**" if not low <= v[c] <= high else f"{v[c]:.3f}") if c in v else "-"
                                       for c in cells) + " |")
    print(f"trips against the truth: {t['trips'] or 'none'}; missed (true calibration outside, no trip): {t['misses'] or 'none'}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=int, default=21)
    ap.add_argument("--rows-per-day", type=int, default=5000)
    ap.add_argument("--window", default="4d")
    ap.add_argument("--first", type=int, default=8, help="first judged day (1-based): the first window's model is judged the day before")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--sizes", default="tiny", choices=["tiny", "config"],
                    help="model sizes: lattice.training.tiny's (the teacher 8-wide, the student 4-wide in half the "
                         "rows) or the market config's own teacher and student")
    ap.add_argument("--student-warm-start", default="none", choices=["none", "last"],
                    help="the daily student: from scratch on the window (none) or continued from the last student (last)")
    ap.add_argument("--window-validation", type=float, default=1.0,
                    help="training.window_validation: the share of the window's newest day held out for validation "
                         "(the rest trains); 1 holds out the whole day")
    ap.add_argument("--retrain-validation-share", type=float, default=None,
                    help="(C) monitoring.retrain_validation_share: the share of the newest window day (the tripped day) "
                         "a rule-started retrain holds out for validation; its teacher and student train on the rest "
                         "(default: the config's)")
    ap.add_argument("--label-delay", default="naive", choices=["naive", "mask", "zipper"],
                    help="training.label_delay; mask needs a window longer than the 7d attribution window (else no "
                         "conversion label of a train day is known at the cutoff and the conversion heads never train)")
    ap.add_argument("--zipper-windows", default="1d,3d,7d",
                    help="training.zipper.windows under --label-delay zipper")
    ap.add_argument("--zipper-shares", default=None,
                    help="training.zipper.shares under --label-delay zipper, one per window (e.g. 0.2,0.2,0.6); "
                         "default equal shares")
    ap.add_argument("--replay", type=float, default=0.0,
                    help="training.replay: the share of older window days a warm start trains on beside the new days "
                         "(under mask, the only days whose conversions have matured)")
    ap.add_argument("--refresh-every", default=None, metavar="Nd",
                    help="training.refresh_every: the warm chain (a) goes back to scratch once it began N days before "
                         "the run's interval end (default: never)")
    ap.add_argument("--leaves", action="store_true",
                    help="keep the config's leaf features (models.leaves; the tiny sizes turn them off): their trees "
                         "are fitted every day on the day's window, and a warm chain keeps its first run's")
    ap.add_argument("--replay-rows", default="rotating", choices=["fixed", "rotating"],
                    help="training.replay_rows: the same hashed rows every run, or another share each run")
    ap.add_argument("--shock-day", type=int, default=12, help="0-based day the shock starts (the market's shock.day)")
    ap.add_argument("--seed", type=int, default=7, help="draws the backfilled days")
    ap.add_argument("--market-seed", type=int, default=42)
    ap.add_argument("--no-shock", action="store_true", help="a market without the shock ((C)'s false alarms: run with --parts C)")
    ap.add_argument("--parts", default="A,B,C")
    ap.add_argument("--cal-low", type=float, default=0.9)
    ap.add_argument("--cal-high", type=float, default=1.1)
    ap.add_argument("--min-positives", type=int, default=100)
    ap.add_argument("--periods", type=int, default=1)
    ap.add_argument("--first-max-ne", type=float, default=None,
                    help="promotion.floors.max_ne (the first model's gate only; default: the config's)")
    ap.add_argument("--first-min-auc", type=float, default=None,
                    help="promotion.floors.min_auc (the first model's gate only): a market whose first window's "
                         "conversion cells have a handful of positives can fail the floors, and (C) then serves nothing")
    ap.add_argument("--first-calibration", default=None, metavar="LOW,HIGH",
                    help="promotion.calibration for the first model's gate only, e.g. 0.2,5")
    ap.add_argument("--truth-of", default=None, metavar="WORKDIR",
                    help="no run: judge the trips of a finished (C) against the market's truth, from its kept "
                         "workdir (the `workdir` line it printed) and its --json file")
    ap.add_argument("--cal-confidence", type=float, default=0.95,
                    help="the calibration rule's interval (0: the point estimate alone, the rule before it)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--scoring", default="http", choices=["http", "predict"],
                    help="(C) scores each day's impressions through `lattice serve --replay-clock` over HTTP (batches "
                         "of 256, logged at the day's noon) or through `lattice predict --logged-at` (the same log schema)")
    ap.add_argument("--port", type=int, default=8791, help="(C)'s server port with --scoring http")
    ap.add_argument("--warmup-in-one-run", action="store_true",
                    help="days 1..first-2 (before anything is trained, judged or served) in one features run over their interval")
    args = ap.parse_args()
    if args.truth_of:
        report_c = json.loads(Path(args.json).read_text())["C"]
        low, high = report_c.get("cal", (args.cal_low, args.cal_high))
        t = truth_verdicts(Path(args.truth_of) / "serve", report_c, low, high)
        print_truth(t, low, high)
        return
    os.environ.setdefault("LATTICE_SPARK_MEMORY", "2g")
    logging.getLogger().setLevel(logging.WARNING)
    parts = set(args.parts.split(","))
    args.serve_hook = None
    report: dict = {"args": {k: v for k, v in vars(args).items() if k != "serve_hook"}}
    base = Path(tempfile.mkdtemp(prefix="bench-market-life-"))
    cfg = build_config(args, args.market_seed, not args.no_shock, base)
    life = Life(args, cfg, base)
    t0 = time.perf_counter()
    m = life.synth()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; demo market "
          f"{args.days * args.rows_per_day:,} rows over {args.days} days ({args.rows_per_day:,}/day), seed {args.market_seed}; "
          f"shock: {cfg.synthetic.market.shock}; {args.sizes} model sizes; {args.epochs} epoch(s); student warm start "
          f"{args.student_warm_start}; label delay {args.label_delay}{' ' + args.zipper_windows + (' shares ' + args.zipper_shares if args.zipper_shares else '') if args.label_delay == 'zipper' else ''}; replay {args.replay} ({args.replay_rows}); refresh every {args.refresh_every or 'never'}; leaves {'on' if args.leaves else 'off'}; workdir {base}")
    report["market"] = {k: m.get(k) for k in ("rows", "rows_per_domain", "label_sums")}
    serve = None
    if "C" in parts:
        serve = Serving(life, report)
        args.serve_hook = serve.hook
    if "A" in parts:
        part_a(life, report)
    else:
        # (C) alone: the days before the first champion's window ends hold nothing to score or
        # monitor, so --warmup-in-one-run runs them as (A) does, in one features run
        warm = max(0, args.first - 2) if args.warmup_in_one_run else 0
        if warm:
            life.features(0, warm)
        for k in range(warm, args.days):
            if args.serve_hook:
                args.serve_hook(k, "before_features")
            life.features(k)
            if args.serve_hook:
                args.serve_hook(k, "after_features")
    if serve is not None:
        serve.close()
    print(f"\nforward run: {time.perf_counter() - t0:.0f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    if serve is not None:
        try:
            serve.summarize()
        except Exception as exc:  # noqa: BLE001 - the figures above stay printed; say what broke
            print(f"(C) summary failed: {type(exc).__name__}: {exc}")
    if "B" in parts:
        t = time.perf_counter()
        try:
            part_b(life, report)
        except Exception as exc:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            print(f"(B) failed: {type(exc).__name__}: {exc}")
        print(f"\nbackfill: {time.perf_counter() - t:.0f} s")
    print(f"\ntotal: {time.perf_counter() - t0:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
