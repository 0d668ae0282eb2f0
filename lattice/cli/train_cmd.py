"""`lattice train CONFIG --model teacher|student|separate|pooled|mmoe|shared_bottom|gbdt|gbdt_cell|all-baselines`."""

from __future__ import annotations

import argparse
import sys

from lattice.cli.common import add_set_argument, config_and_paths

CHOICES = ["teacher", "student", "separate", "pooled", "mmoe", "shared_bottom", "gbdt", "gbdt_cell", "all-baselines"]


def summary_table(config, metrics: dict[str, dict]) -> str:
    """Rows: cells + macro; columns: models and the oracle (where truth columns exist)."""
    names = list(metrics)
    cells = [f"{d}/{o}" for d, o in config.cells()]
    has_oracle = any(m["cells"].get(c, {}).get("oracle_ne") is not None for m in metrics.values() for c in cells)
    head = ["cell (test NE)"] + names + (["oracle"] if has_oracle else [])
    rows = []
    for c in cells:
        row = [c] + [_fmt(metrics[n]["cells"].get(c, {}).get("ne")) for n in names]
        if has_oracle:
            row.append(_fmt(next((m["cells"][c].get("oracle_ne") for m in metrics.values() if c in m["cells"]), None)))
        rows.append(row)
    macro = ["macro NE"] + [_fmt(metrics[n]["macro"]["ne"]) for n in names] + ([_fmt(next(iter(metrics.values()))["macro"].get("oracle_ne"))] if has_oracle else [])
    auc = ["macro AUC"] + [_fmt(metrics[n]["macro"]["auc"]) for n in names] + ([""] if has_oracle else [])
    rows += [macro, auc]
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    line = lambda r: "  ".join(str(v).ljust(w) if i == 0 else str(v).rjust(w) for i, (v, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _fmt(x) -> str:
    return "-" if x is None or x != x else f"{x:.4f}"


def resume_command(args: argparse.Namespace, model: str) -> str:
    """This command line, for `model`, with --resume: what continues a failed run."""
    import shlex

    cmd = ["lattice", "train", args.config, "--model", model, "--resume"]
    for flag, value in (("--nproc", args.nproc), ("--epochs", args.epochs), ("--workdir", args.workdir),
                        ("--seed", args.seed), ("--teacher-scores", args.teacher_scores), ("--node-rank", args.node_rank)):
        if value is not None:
            cmd += [flag, str(value)]
    for override in args.overrides:
        cmd += ["--set", override]
    return shlex.join(cmd)


def _train(args: argparse.Namespace) -> int:
    import json

    from lattice.data.loader import NoTrainingData
    from lattice.models.build import baseline_names
    from lattice.deploy.profile import ProfileError
    from lattice.training.checkpoint import CheckpointError
    from lattice.training.launch import RankFailed
    from lattice.training.stages import train
    from lattice.training.warm_start import WarmStartError

    config, paths = config_and_paths(args)
    if args.validation_share is not None and args.validation_share < 1 and config.training.window is None:
        print(f"error: --validation-share {args.validation_share} holds out a share of a window's newest day, and "
              "training.window is unset: set it (e.g. --set training.window=14d) or leave --validation-share out",
              file=sys.stderr)
        return 2
    models = baseline_names(config) if args.model == "all-baselines" else [args.model]
    results = {}
    for name in models:
        try:
            s = train(config, paths, model=name, nproc=args.nproc, epochs=args.epochs, teacher_scores=args.teacher_scores,
                      seed=args.seed, resume=args.resume, node_rank=args.node_rank, resume_hint=resume_command(args, name),
                      end=args.end, warm_start=args.warm_start, validation_share=args.validation_share)
        except (NoTrainingData, FileNotFoundError, CheckpointError, RankFailed, ProfileError, WarmStartError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(f"\ninterrupted: {name} stopped; `{resume_command(args, name)}` continues "
                  f"from its last checkpoint (every {config.training.checkpoint_every} steps)", file=sys.stderr)
            return 130
        if "node_rank" in s:  # one node of a cluster: node 0 reports the run
            print(f"node {s['node_rank']} of {name}'s training finished; node 0 writes the model and its metrics")
            return 0
        if "trees" in s["cost"]:  # a LightGBM baseline: trees, not parameters
            print(f"trained {name} in {s['seconds']:.0f}s: {s['cost']['boosters']} booster(s), {s['cost']['trees']:,} trees, "
                  f"{s['cost']['leaves']:,} leaves -> {s['model_dir']}")
        else:
            print(f"trained {name} on {s['world_size']} rank(s) in {s['seconds']:.0f}s: best epoch {s['best_epoch']}, "
                  f"{s['cost']['params']:,} params, {s['cost']['flops_per_example']:,.0f} FLOPs/example -> {s['model_dir']}")
            if s.get("stop_reason"):
                print(f"  {'stopped early' if s.get('stopped_early') else 'ran to the end'}: {s['stop_reason']}")
        results[name] = json.loads((paths.model_dir(name) / "metrics.json").read_text())
    # show the new models next to every other trained model of this workdir
    for other in sorted(p.name for p in paths.models.glob("*") if (p / "metrics.json").exists()):
        results.setdefault(other, json.loads((paths.model_dir(other) / "metrics.json").read_text()))
    from lattice.evaluation.versus import versus_lines, versus_trees

    print()
    print(summary_table(config, results))
    for line in versus_lines(versus_trees(results)):
        print(line)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train the MDMO teacher, the student or the baselines (TorchRec, torchrun; LightGBM trees)")
    p.add_argument("config", help="platform config YAML, e.g. configs/demo.yaml")
    p.add_argument("--model", default="teacher", choices=CHOICES, help="what to train (all-baselines: those enabled in models.baselines)")
    p.add_argument("--nproc", type=int, default=None,
                   help="ranks (per node with the scale-out profile) for torchrun (default: training.nproc; 1 = in this process; 0 = one per GPU, else 1)")
    p.add_argument("--epochs", type=int, default=None, help="default: training.epochs")
    p.add_argument("--workdir", default=None, help="default: the config's workdir (or $LATTICE_WORKDIR)")
    p.add_argument("--teacher-scores", default=None, help="parquet of example_id + p_<objective> (distillation)")
    p.add_argument("--seed", type=int, default=None, help="default: training.seed")
    p.add_argument("--resume", action="store_true",
                   help="continue from the model's last checkpoint (any --nproc: the checkpoint is resharded)")
    p.add_argument("--node-rank", type=int, default=None,
                   help="scale-out profile on a real cluster: start only this node's torchrun (0..nnodes-1); "
                        "run the same command with each node's rank on each node")
    p.add_argument("--end", default=None, metavar="YYYY-MM-DD",
                   help="with training.window: the interval end (exclusive) the window ends at; the test day is this day "
                        "(default: the table's latest day + 1)")
    p.add_argument("--warm-start", default=None, choices=["none", "last", "champion"],
                   help="continue from the last model or the champion (default: training.warm_start)")
    p.add_argument("--validation-share", type=_share, default=None, metavar="SHARE",
                   help="with training.window: hold out only this share (0-1] of the window's newest day for "
                        "validation and train on the rest, as a retrain a monitoring rule started does "
                        "(default: training.window_validation)")
    add_set_argument(p)
    p.set_defaults(func=_train)


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:  # nan fails too
        raise argparse.ArgumentTypeError(f"{text!r}: give a share in (0, 1], e.g. 0.5")
    return value
