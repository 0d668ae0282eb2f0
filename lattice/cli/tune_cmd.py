"""`lattice tune CONFIG --model teacher --trials N [--study NAME] [--timeout S]`: hyperparameter
search (Optuna) over the keys of the config's `tune.space`, each trial judged by its validation
macro NE (the test split is never read). The study lives in `<workdir>/tune/<study>/study.db`: a
rerun continues it up to N trials in total. Prints one line per trial, then the best trial, its
validation NE and the `lattice train` command that uses it; writes `<workdir>/tune/<study>/overlay.yaml`.
"""

from __future__ import annotations

import argparse
import sys

from lattice.cli.common import add_set_argument, load_or_exit


def _tune(args: argparse.Namespace) -> int:
    from lattice.config import ConfigError
    from lattice.data.loader import NoTrainingData
    from lattice.paths import Paths
    from lattice.tuning.stages import tune

    config = load_or_exit(args.config, args.overrides)
    paths = Paths.for_config(config, args.workdir)
    try:
        s = tune(config, paths, model=args.model, trials=args.trials, epochs=args.epochs, study=args.study,
                 timeout=args.timeout, nproc=args.nproc)
    except ConfigError as exc:
        for p in exc.problems:
            print(p.render(exc.file), file=sys.stderr)
        return 1
    except (NoTrainingData, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted: the finished trials are kept in the study; rerun the same command to continue it",
              file=sys.stderr)
        return 130
    print()
    print(f"best trial {s['best_trial']} of {s['trials_total']} (study {s['study']!r}): "
          f"validation macro NE {s['best_val_macro_ne']:.4f}")
    for cell, ne in s["best_val_ne"].items():
        print(f"  {cell}: validation NE {ne:.4f}")
    for k, v in s["best_params"].items():
        print(f"  {k} = {v}")
    print(f"overlay: {s['overlay']}")
    print(f"MLflow experiment {s['mlflow_experiment']!r} ({s['tracking_uri']})")
    print(f"train with it: {s['command']}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="hyperparameter search (Optuna) on the validation split; resumable, logged in MLflow")
    p.add_argument("config", help="platform config YAML; its `tune` section holds the search space")
    p.add_argument("--model", default="teacher", choices=["teacher"], help="what to tune")
    p.add_argument("--trials", type=int, default=None, help="trials of the study in total (default: tune.trials); "
                   "a rerun runs only the missing ones")
    p.add_argument("--epochs", type=int, default=None, help="epochs per trial (default: tune.epochs)")
    p.add_argument("--study", default=None, help="study name (default: the model); its folder is <workdir>/tune/<study>")
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="start no new trial after S seconds")
    p.add_argument("--nproc", type=int, default=None, help="ranks per trial (default: training.nproc)")
    p.add_argument("--workdir", default=None, help="default: the config's workdir (or $LATTICE_WORKDIR)")
    add_set_argument(p)
    p.set_defaults(func=_tune)
