"""Stages `train` and `score` (see lattice/stages.py).

`train` fits the dense stats on the train split, writes a run spec and runs the per-rank loop:
in this process for one rank, under torchrun for more (lattice/training/launch.py: one node in
the embedded profile, several with the scale-out profile's torchrun section).
Everything lands in `paths.model_dir(model)`: model.pt, checkpoint/ (DCP, see checkpoint.py),
plan.json, history.json, metrics.json, predictions.parquet (test split), summary.json.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from pathlib import Path

import pandas as pd

from lattice.config import PlatformConfig
from lattice.data.loader import BatchLoader, find_table, fit_dense_stats
from lattice.data.split import SPLITS
from lattice.deploy.profile import ProfileError
from lattice.models import kind_of
from lattice.models.build import GBDT_KINDS
from lattice.paths import Paths
from lattice.progress import progress_bar
from lattice.relay import run_child
from lattice.training import checkpoint, launch
from lattice.training.spec import RunSpec

log = logging.getLogger("lattice.training.ranks")  # what torchrun's ranks write, off a terminal


def _refresh(config: PlatformConfig, model: str, parent, window) -> dict | None:
    """training.refresh_every: why a warm start goes back to scratch (its chain began that many days
    or more before this run's interval end), or None to continue the parent."""
    every = config.training.refresh_every
    if parent is None or window is None or every is None:
        return None
    from lattice.data.window import as_date, window_days
    from lattice.training import lineage

    started = lineage.chain_started(parent.lineage)
    age = (as_date(window.end) - as_date(started)).days if started is not None else 0
    if age < window_days(every):
        return None
    logging.getLogger(__name__).info(
        "training.refresh_every %s: %s's chain of warm starts began at %s, %d days before this run's interval end %s; "
        "it trains from scratch on the window (trees, id maps and dense statistics of the window)", every, model,
        started, age, window.end)
    return {"every": every, "chain_started": started, "parent": str(parent.folder / "model.pt")}


def _add_matured_days(config: PlatformConfig, days, window, parent) -> None:
    """Under `label_delay: mask`, a warm start also trains the parent's days whose delayed labels
    became known since the parent's cutoff, on those labels only (lattice.data.label_time)."""
    from lattice.data.label_time import matured_days
    from lattice.data.window import DaySplits

    before = DaySplits.from_json((parent.lineage or {}).get("splits"))
    parent_cutoff = before.cutoff() if before is not None else None
    seen = set(parent.days_seen)
    days.matured = matured_days(config, [d for d in window.train if d in seen], parent_cutoff, days.cutoff())
    days.parent_cutoff = parent_cutoff.isoformat() if days.matured else None


def train(config: PlatformConfig, paths: Paths, model: str = "teacher", nproc: int | None = None, epochs: int | None = None,
          teacher_scores: str | Path | None = None, seed: int | None = None, resume: bool = False,
          checkpoint_every: int | None = None, stop_after: int | None = None, progress: bool = True,
          validation_only: bool = False, node_rank: int | None = None, resume_hint: str | None = None,
          end: str | None = None, data_end: str | None = None, warm_start: str | None = None,
          validation_share: float | None = None) -> dict:
    """Train one model (teacher | student | separate | pooled | mmoe | shared_bottom | gbdt |
    gbdt_cell, optionally 'kind@tag'). `teacher_scores`: parquet of example_id + p_<objective>
    (distillation). The LightGBM baselines go to lattice.training.gbdt_stage before any torch
    code: they have no epochs or ranks (`nproc` and `epochs` do not apply: their rounds stop early on
    the validation split, their threads are models.baselines.trees.num_threads). `validation_only`
    (`lattice tune`): the run ends at its best validation, reads no test row and writes no model.pt
    or metrics.json; the summary's `val_macro_ne` / `val_ne` are the validation figures.
    `node_rank` (scale-out profile, a real cluster): start only this node's torchrun; node 0's
    result is the summary, other nodes return {"node_rank": i}. `resume_hint`: the command a
    failed run names to resume (the CLI passes its own; default: built from the arguments).
    A rank that dies raises `launch.RankFailed`, naming the rank, its node and that command.
    `end` (alias `data_end`: Airflow's data_interval_end): the run's interval end, exclusive, as
    YYYY-MM-DD; with `training.window` the window ends there (default: the table's latest day + 1).
    `warm_start`: none | last | champion, overriding `training.warm_start` (lattice.training.warm_start).
    `validation_share`: the share of the window's newest day held out for validation, overriding
    `training.window_validation` (a retrain a monitoring rule started passes
    `monitoring.retrain_validation_share`); recorded in the lineage's splits."""
    if kind_of(model) in GBDT_KINDS:
        if validation_only:
            raise ValueError(f"{model!r} is a LightGBM baseline: validation_only (lattice tune) covers the deep models")
        if teacher_scores is not None or resume:
            raise ValueError(f"{model!r} is a LightGBM baseline: it takes no teacher scores and no --resume "
                             "(a fit starts from scratch)")
        from lattice.training.gbdt_stage import train_gbdt

        return train_gbdt(config, paths, model, seed=seed, progress=progress, end=end or data_end)
    table = find_table(paths)
    from lattice.trees.leaves import forest_for

    out = paths.model_dir(model)
    from lattice.data.window import held_out_share, resolve as resolve_window
    from lattice.training import lineage, warm_start as ws

    window = resolve_window(config, table, end or data_end)
    mode = warm_start or config.training.warm_start
    # a resume keeps the parent found when the run started (it is in <model dir>/parent/ by then)
    parent = ws.find_parent(config, paths, model, mode) if mode != "none" else None
    if mode != "none" and parent is None:
        logging.getLogger(__name__).info("warm start %s: no parent model yet; %s trains from scratch", mode, model)
    refreshed = _refresh(config, model, parent, window)
    if refreshed is not None:
        parent = None
    if parent is None:  # leaves on and no tree fit of this window, id maps of other days: refused before anything moves
        forest_for(config, paths, kind_of(model), window=window, validation_share=validation_share)
        from lattice.hashing.store import check_window

        check_window(config, paths, window, validation_share)
    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        (out / "warm_maps.pt").unlink(missing_ok=True)  # a previous warm start's refit, never this run's
    if validation_share is not None and not 0 < validation_share <= 1:
        raise ValueError(f"validation_share {validation_share}: give a share in (0, 1] of the window's newest day")
    if validation_share is not None and validation_share < 1 and window is None:
        raise ValueError(f"validation_share {validation_share} holds out a share of a window's newest day, and "
                         "training.window is unset: set training.window (e.g. '14d') or leave validation_share out")
    days = window.splits(parent.days_seen if parent else (), config.training.replay if parent else 0.0,
                         held_out_share(config, validation_share),
                         rotate_replay=config.training.replay_rows == "rotating") if window else None
    if days is not None and parent is not None:
        _add_matured_days(config, days, window, parent)
    if days is not None and not days.train_days() and not days.replay and not days.matured:
        raise ws.WarmStartError(f"nothing to train {model!r} on: its parent has trained on every train day of the window "
                         f"{window.train[0]}..{window.train[-1]} and training.replay is 0; move the interval end "
                         "(`end`) past the parent's days, set training.replay, or warm_start: none")
    run_lineage = lineage.build(mode, parent.to_json() if parent else None, window, days,
                                lineage.chain_started(parent.lineage) if parent else None, refreshed)
    unlabelled: list[str] = []
    if days is not None:
        from lattice.data.label_time import never_known_in_window

        train_days = days.train_days() + list(days.replay) + list(days.matured)
        unlabelled = never_known_in_window(config, train_days, days.cutoff())
        if unlabelled:
            logging.getLogger(__name__).warning(
                "%s: no train day's %s label is known at the cutoff %s (attribution window longer than the age of every "
                "train day, label_delay: mask): those heads train on no label; widen training.window past the "
                "attribution window, set training.replay (warm starts), or use Zipper heads", model,
                ", ".join(unlabelled), days.cutoff())
    if teacher_scores is not None and not Path(teacher_scores).exists():
        raise FileNotFoundError(f"teacher scores {teacher_scores} do not exist; make them with "
                                f"lattice.training.stages.score(config, paths, 'teacher')")
    if resume:
        checkpoint.check_resumable(out / "checkpoint", model)
    stats_path = out / "dense_stats.json"
    if parent is not None and not resume:
        import torch

        blob = torch.load(parent.folder / "model.pt", map_location="cpu", weights_only=False)
        if config.training.warm_dense_stats == "keep":
            # the parent's layers learned on these z-scores (lattice.training.warm_start)
            from lattice.data.transforms import DenseStats

            DenseStats.from_json(blob["dense_stats"]).save(stats_path)
        else:
            fit_dense_stats(config, table, days).save(stats_path)
        maps = blob.get("hashing") or {}
        if maps:
            from lattice.hashing.refit import refit

            maps = refit(config, maps, table, days)
            torch.save(maps, out / "warm_maps.pt")
        # refused here, before the parent is moved: a refused run leaves the model folder as it was
        from lattice.data.transforms import DenseStats
        from lattice.models import build_model

        grown = ws.grown_tables(blob.get("hashing") or {}, maps)
        parent_forest = forest_for(config, paths, kind_of(model), blob, window, validation_share)
        plain = build_model(config, kind_of(model), len(DenseStats.load(stats_path).columns), fitted=maps or None,
                            leaves=parent_forest.spec() if parent_forest is not None else None)
        ws.check_compatible(plain, blob, config, kind_of(model), grown)
        if not node_rank:
            ws.set_aside(parent, out)
    elif not (resume and stats_path.exists()):
        fit_dense_stats(config, table, days).save(stats_path)
    # after the parent (and its checkpoint: the optimizer state) was set aside
    if not resume and not node_rank:  # node 0 (or the only one) owns the folder; other nodes may share it
        shutil.rmtree(out / "checkpoint", ignore_errors=True)
    for stale in ("summary.json",):
        (out / stale).unlink(missing_ok=True)
    lay = launch.layout(config, nproc, run_id=re.sub(r"[^A-Za-z0-9_-]", "-", f"lattice-{config.name}-{model}"))
    spec = RunSpec(
        config=config.model_dump(mode="json"), workdir=str(paths.workdir), data_root=str(paths.data_root), model=model,
        epochs=epochs or config.training.epochs, seed=config.training.seed if seed is None else seed, table=str(table),
        teacher_scores=str(Path(teacher_scores).resolve()) if teacher_scores else None,
        checkpoint_every=config.training.checkpoint_every if checkpoint_every is None else checkpoint_every,
        stop_after=stop_after, resume=resume, progress=progress, validation_only=validation_only,
        days=days.to_json() if days is not None else None, parent=str(parent.folder) if parent else None,
        fitted=str(out / "warm_maps.pt") if parent is not None and (out / "warm_maps.pt").exists() else None,
        lineage=run_lineage,
    )
    spec_path = spec.save(out / "run_spec.json")
    started = time.perf_counter()
    if lay.world == 1 and lay.rdzv_endpoint is None:
        from lattice.training.loop import run

        result = run(spec)
        if result.get("interrupted"):
            return result
    else:
        own_workdir = None if paths.workdir == Paths.for_config(config).workdir else paths.workdir
        hint = resume_hint or launch.resume_command(config, model, nproc, epochs, own_workdir)
        _run_torchrun(lay, spec_path, model, hint, node_rank)
        if node_rank:
            return {"node_rank": node_rank, "model": model}
        if not (out / "summary.json").exists():
            return {"interrupted": True, "model": model}
    summary = json.loads((out / "summary.json").read_text())
    summary["lineage"] = run_lineage
    if unlabelled:
        summary["unlabelled_objectives"] = unlabelled
    # the parent was needed while the run could fail or resume; its checksum is in the lineage,
    # and a registered copy of this folder should not carry a second model
    if (out / "model.pt").exists():  # (a `lattice tune` trial writes none: its parent stays the model)
        shutil.rmtree(out / ws.PARENT, ignore_errors=True)
    (out / "warm_maps.pt").unlink(missing_ok=True)
    summary["seconds"] = time.perf_counter() - started
    summary["model_dir"] = str(out)
    return summary


def _run_torchrun(lay: launch.Launch, spec_path: Path, model: str, hint: str, node_rank: int | None) -> None:
    """Start this run's node launchers (all of them here, or only `node_rank`'s) and raise
    `launch.RankFailed` when a rank dies."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    if node_rank is not None and not 0 <= node_rank < lay.nnodes:
        raise ProfileError(f"--node-rank {node_rank}: the deployment profile has {lay.nnodes} node(s) (0..{lay.nnodes - 1})")
    errors_root = spec_path.parent / launch.ERRORS_DIR
    shutil.rmtree(errors_root, ignore_errors=True)  # an earlier run's files must not name this run's failure
    if lay.local_nodes and node_rank is None:
        results = launch.run_nodes([lay.command(spec_path, i) for i in range(lay.nnodes)], env, log)
        nodes = list(range(lay.nnodes))
    else:
        cmd = lay.command(spec_path, node_rank or 0)
        results, nodes = [run_child(cmd, env, log, launch.SUMMARY_TAIL_LINES)], [node_rank or 0]
    failures = [f for (code, tail), i in zip(results, nodes) if code != 0 and (f := launch.failure_from(tail, i))]
    codes = [code for code, _ in results if code != 0]
    if codes:
        errors = sorted((e for i in nodes for e in launch.rank_errors(launch.error_dir(spec_path, i), i)),
                        key=lambda e: e.timestamp)
        if errors:  # the first exception's traceback says more than the ranks' last stderr lines
            last = "\ntraceback of the first failed rank:\n" + errors[0].traceback.rstrip()
        else:  # killed by a signal: no error file, the stderr tail is all there is
            tails = [line for code, tail in results if code != 0 for line in tail]
            last = "\nlast lines of the ranks' stderr:\n" + "\n".join(tails[-40:]) if tails else ""
        raise launch.RankFailed(model, lay, launch.pick(failures), codes[0], hint, last, errors[0] if errors else None)
    shutil.rmtree(errors_root, ignore_errors=True)  # a model folder carries no empty launcher logs


def score(config: PlatformConfig, paths: Paths, model: str, split: str = "all", out: str | Path | None = None,
          progress: bool = True) -> Path:
    """example_id, domain, p_<objective> for every example of `split`, from a trained model
    (single process). The teacher's table feeds distillation."""
    from lattice.evaluation.stages import load_model, predict

    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {SPLITS}")
    net = load_model(config, paths, model)
    out = Path(out) if out else paths.teacher_scores / f"{model}_{split}.parquet"
    out.parent.mkdir(parents=True, exist_ok=True)
    # Read in this process, no worker: scoring runs inside callers that hold threads of their own
    # (Spark's py4j in the demo and the tests, Airflow's task runner), and a DataLoader worker
    # forked from such a process once hung in CI on a lock copied mid-use. It costs nothing here:
    # 1M test rows of the 10M set scored in 17.0-17.4 s in-line, 18.3-19.0 s with one worker.
    from lattice.data.window import DaySplits

    # a windowed model's splits are its run's days (its lineage), not the table's stored column
    days = DaySplits.from_json(((net.meta or {}).get("lineage") or {}).get("splits"))
    loader = BatchLoader(config, find_table(paths), net.dense_stats, split, shuffle=False, batch_size=8192, num_workers=0,
                         days=days, leaves=getattr(net, "leaf_forest", None))
    frames = []
    for batch in progress_bar(loader, desc=f"score {model} ({split})", unit="batch", enabled=progress):
        probs = predict(net, batch)
        f = {"example_id": batch.example_ids, "domain": [config.domain_names[i] for i in batch.domain.tolist()]}
        f.update({f"p_{o}": p.numpy() for o, p in probs.items()})
        frames.append(pd.DataFrame(f))
    from lattice.data.passthrough import attach

    attach(config, find_table(paths), pd.concat(frames, ignore_index=True)).to_parquet(out, index=False)
    return out


def score_stage(config: PlatformConfig, paths: Paths, model: str = "teacher", split: str = "all", out: str | None = None) -> dict:
    path = score(config, paths, model, split, out, progress=False)
    return {"model": model, "split": split, "scores": str(path), "rows": int(pd.read_parquet(path, columns=["example_id"]).shape[0])}
