"""`lattice demo [--workdir DIR] [--rows N]`: the whole platform on embedded defaults."""

from __future__ import annotations

import argparse
from pathlib import Path


def _f(value) -> str:
    return "-" if value is None or value != value else f"{value:.4f}"


def _summary(report: dict) -> str:
    from lattice.demo.report import version_label as _v

    lines = ["", "Headline: macro NE per objective (test split; lower is better)"]
    head = report.get("headline", {})
    objs = sorted({o for v in head.values() for o in v})
    lines.append(f"  {'model':<22}" + "".join(f"{o:>12}" for o in objs))
    for model, vals in head.items():
        lines.append(f"  {model:<22}" + "".join(f"{vals.get(o, float('nan')):>12.4f}" for o in objs))
    promo = report.get("promotion") or {}
    if promo:
        lines.append(f"\nPromotion: {promo.get('decision', '?')} (champion {_v(promo.get('champion_before'))} -> {_v(promo.get('champion_after'))})")
    life = (report.get("days") or {}).get("rounds") or []
    if life:
        lines.append(f"\nDays (training.window {report['days']['window']}; next-day macro NE of the challenger / champion):")
        for r in life:
            ne = r.get("next_day_macro_ne") or {}
            champ = ne.get("champion")
            lines.append(f"  {r['test_day']}  {r['warm_start']:<5} trained on {len(r['trained_days']):>2} new day(s), "
                         f"{r['teacher_examples']:>7,} examples; v{r.get('challenger_version')} "
                         f"{_f(ne.get('challenger'))} / {_f(champ)}: {r.get('decision')} "
                         f"(champion {_v(r.get('champion_before'))} -> {_v(r.get('champion_after'))})")
    serving = report.get("serving") or {}
    if serving:
        lines.append(f"Serving check: {serving.get('requests', 0)} requests, {serving.get('failed', 0)} failed, "
                     f"max |Δp| vs offline {serving.get('max_abs_diff_vs_offline', float('nan')):.2e} "
                     f"(tolerance {serving.get('tolerance', float('nan')):g}), p99 {serving.get('latency_p99_ms', float('nan')):.1f} ms")
    lines.append("\nStage timings:")
    for t in report.get("timings", []):
        lines.append(f"  {t['stage']:<22}{t['seconds']:>9.1f}s  {t['status']}")
    return "\n".join(lines)


def _demo(args: argparse.Namespace) -> int:
    from lattice.cli.common import load_or_exit
    from lattice.demo.pipeline import run_demo
    from lattice.paths import Paths

    config = load_or_exit(args.config)
    if args.workdir:
        wd = Path(args.workdir).resolve()
        paths = Paths(workdir=wd, data_root=wd / "raw")
    else:
        paths = Paths.for_config(config)
    from lattice.demo.life import LifeError

    try:
        report = run_demo(config, paths, rows=args.rows, nproc=args.nproc, epochs=args.epochs,
                          serve_requests=args.requests, progress=not args.quiet,
                          config_file=args.config, days=args.days)
    except LifeError as exc:
        print(f"lattice demo: --days {args.days}: {exc}")
        return 2
    print(_summary(report))
    print(f"\nreport: {paths.workdir / 'report.html'}  (and report.json)")
    if report.get("status") != "ok":
        print(f"demo FAILED: {report.get('error')}")
        return 1
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the whole platform end to end on synthetic data and write a report")
    p.add_argument("--config", default="configs/demo.yaml")
    p.add_argument("--workdir", default=None, help="work directory (default .lattice/demo); raw logs go to WORKDIR/raw")
    p.add_argument("--rows", type=int, default=150_000, help="synthetic impressions to generate (quality needs 1M+; the default keeps the run short)")
    p.add_argument("--nproc", type=int, default=2, help="training processes for the sharded teacher")
    p.add_argument("--epochs", type=int, default=None, help="override training.epochs")
    p.add_argument("--requests", type=int, default=300, help="requests sent in the serving check")
    p.add_argument("--days", type=int, default=2,
                   help="daily rounds after the first window: each brings the next day's features, continues the "
                        "teacher and student on it (warm start) and gates the student on that day; 0: one window "
                        "and the config's split")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_demo)
