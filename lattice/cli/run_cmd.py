"""`lattice run CONFIG [--from STEP] [--to STEP] [--start DATE --end DATE]`: the pipeline graph's
steps in order, through the executor the DAG tasks use (scratch-and-swap of model folders, domain
subsets, the data interval). `--from`/`--to` take a step (`consolidate`, `train_teacher`, ...) or a
family (`features`, `train_teacher`, `distill`, `promote`); `--list` prints the graph."""

from __future__ import annotations

import argparse
import sys
import time

from lattice.cli.common import add_set_argument, config_and_paths


def _list(steps) -> None:
    for s in steps:
        print(f"{s.family:<14}{s.task_id:<22}{s.stage:<14}reads {', '.join(s.reads) or '-'}  ->  writes {', '.join(s.writes) or '-'}")


def _params(args: argparse.Namespace) -> dict:
    params: dict = {}
    for name in ("start", "end", "epochs", "nproc"):
        if getattr(args, name) is not None:
            params[name] = getattr(args, name)
    for name in ("domains", "objectives"):
        if getattr(args, name):
            params[name] = getattr(args, name).split(",")
    if args.dry_run:
        params["dry_run"] = True
    return params


def _run(args: argparse.Namespace) -> int:
    from lattice.orchestration.graph import pipeline, select
    from lattice.orchestration.spec import dag_specs
    from lattice.orchestration.task_runner import GateRejected, NotYet, RunContext, TaskError, check_params, execute

    config, paths = config_and_paths(args, ensure=not args.list)
    try:
        steps = select(pipeline(config), args.from_step, args.to_step)
    except KeyError as exc:
        print(f"run: {exc.args[0]}", file=sys.stderr)
        return 2
    if args.list:
        _list(steps)
        return 0
    specs = {d.family: d.params for d in dag_specs(config)}
    params = _params(args)
    try:  # the same checks a DAG trigger gets (dates, end after start)
        check_params({k: v for k, v in params.items() if k in ("start", "end")}, specs["features"])
    except TaskError as exc:
        print(f"run: {exc}", file=sys.stderr)
        return 2
    ctx = RunContext(config, paths, params, config_file=args.config, overrides=list(args.overrides), extra={"progress": not args.quiet})
    print(f"run: {config.name}, {len(steps)} steps ({steps[0].task_id} .. {steps[-1].task_id}) in {paths.workdir}", flush=True)
    for i, step in enumerate(steps, 1):
        started = time.perf_counter()
        print(f"\n━━ [{i}/{len(steps)}] {step.family} · {step.task_id} ({step.stage}) ━━", flush=True)
        try:
            result = execute(ctx, step, specs[step.family])
        except GateRejected as exc:
            print(f"{exc}", file=sys.stderr)
            return 3  # the gate said no: a distinct exit code, not a crash
        except NotYet as exc:  # the challenger's next day is not in the table: nothing after it can run yet
            print(f"   {exc}\nrun: stopped at {step.task_id}; run the features of that day, then `--from {step.task_id}`", flush=True)
            return 0
        except TaskError as exc:
            print(f"run: step {step.task_id} failed after {time.perf_counter() - started:.1f}s:\n{exc}", file=sys.stderr)
            return 1
        summary = result.get("summary") or {}
        keys = ", ".join(f"{k}={v}" for k, v in summary.items() if isinstance(v, (int, float, str, bool)))[:300]
        print(f"   ok in {time.perf_counter() - started:.1f}s  {keys}", flush=True)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the pipeline graph (the steps the DAGs run) from one step to another")
    p.add_argument("config", help="platform config (YAML)")
    p.add_argument("--from", dest="from_step", default=None, help="first step or family (default: the first)")
    p.add_argument("--to", dest="to_step", default=None, help="last step or family (default: the promotion gate)")
    p.add_argument("--start", default=None, help="data interval start (YYYY-MM-DD, inclusive; default: time_range.start)")
    p.add_argument("--end", default=None, help="data interval end (YYYY-MM-DD, exclusive; default: time_range.end)")
    p.add_argument("--domains", default=None, help="comma-separated subset of domains")
    p.add_argument("--objectives", default=None, help="comma-separated subset of objectives")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--nproc", type=int, default=None, help="training processes (teacher and student)")
    p.add_argument("--dry-run", action="store_true", help="the gate decides but the champion alias does not move")
    p.add_argument("--workdir", default=None)
    p.add_argument("--list", action="store_true", help="print the steps (what each reads and writes) and exit")
    p.add_argument("--quiet", action="store_true")
    add_set_argument(p)
    p.set_defaults(func=_run)
