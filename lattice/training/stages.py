"""Stages `train` and `score` (see lattice/stages.py).

`train` fits the dense stats on the train split, writes a run spec and runs the per-rank loop:
in this process for one rank, under `torchrun --nproc_per_node=N` (gloo on CPU) for more.
Everything lands in `paths.model_dir(model)`: model.pt, checkpoint/, plan.json, history.json,
metrics.json, predictions.parquet (test split), summary.json.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import pandas as pd

from lattice.config import PlatformConfig
from lattice.data.loader import BatchLoader, find_table, fit_dense_stats
from lattice.data.split import SPLITS
from lattice.models import kind_of
from lattice.models.build import GBDT_KINDS
from lattice.paths import Paths
from lattice.progress import progress_bar
from lattice.relay import run_child
from lattice.training.spec import RunSpec

log = logging.getLogger("lattice.training.ranks")  # what torchrun's ranks write, off a terminal


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(config: PlatformConfig, paths: Paths, model: str = "teacher", nproc: int | None = None, epochs: int | None = None,
          teacher_scores: str | Path | None = None, seed: int | None = None, resume: bool = False,
          checkpoint_every: int | None = None, stop_after: int | None = None, progress: bool = True,
          validation_only: bool = False) -> dict:
    """Train one model (teacher | student | separate | pooled | mmoe | shared_bottom | gbdt |
    gbdt_cell, optionally 'kind@tag'). `teacher_scores`: parquet of example_id + p_<objective>
    (distillation). The LightGBM baselines go to lattice.training.gbdt_stage before any torch
    code: they have no epochs or ranks (`nproc` and `epochs` do not apply: their rounds stop early on
    the validation split, their threads are models.baselines.trees.num_threads). `validation_only`
    (`lattice tune`): the run ends at its best validation, reads no test row and writes no model.pt
    or metrics.json; the summary's `val_macro_ne` / `val_ne` are the validation figures."""
    if kind_of(model) in GBDT_KINDS:
        if validation_only:
            raise ValueError(f"{model!r} is a LightGBM baseline: validation_only (lattice tune) covers the deep models")
        if teacher_scores is not None or resume:
            raise ValueError(f"{model!r} is a LightGBM baseline: it takes no teacher scores and no --resume "
                             "(a fit starts from scratch)")
        from lattice.training.gbdt_stage import train_gbdt

        return train_gbdt(config, paths, model, seed=seed, progress=progress)
    table = find_table(paths)
    out = paths.model_dir(model)
    out.mkdir(parents=True, exist_ok=True)
    if teacher_scores is not None and not Path(teacher_scores).exists():
        raise FileNotFoundError(f"teacher scores {teacher_scores} do not exist; make them with "
                                f"lattice.training.stages.score(config, paths, 'teacher')")
    if resume and not any((out / "checkpoint").glob("rank*.pt")):
        raise FileNotFoundError(f"--resume: no checkpoint of {model!r} under {out / 'checkpoint'}; "
                                "train without --resume to start from scratch")
    if not resume:
        shutil.rmtree(out / "checkpoint", ignore_errors=True)
    for stale in ("summary.json",):
        (out / stale).unlink(missing_ok=True)
    stats_path = out / "dense_stats.json"
    if not (resume and stats_path.exists()):
        fit_dense_stats(config, table).save(stats_path)
    n = nproc or config.training.nproc
    spec = RunSpec(
        config=config.model_dump(mode="json"), workdir=str(paths.workdir), data_root=str(paths.data_root), model=model,
        epochs=epochs or config.training.epochs, seed=config.training.seed if seed is None else seed, table=str(table),
        teacher_scores=str(Path(teacher_scores).resolve()) if teacher_scores else None,
        checkpoint_every=config.training.checkpoint_every if checkpoint_every is None else checkpoint_every,
        stop_after=stop_after, resume=resume, progress=progress, validation_only=validation_only,
    )
    spec_path = spec.save(out / "run_spec.json")
    started = time.perf_counter()
    if n == 1:
        from lattice.training.loop import run

        result = run(spec)
        if result.get("interrupted"):
            return result
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", "--nnodes=1",
               "--master_addr=127.0.0.1", f"--master_port={_free_port()}", "-m", "lattice.training.worker", str(spec_path)]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        code, tail = run_child(cmd, env, log)
        if code != 0:
            last = "\nlast lines of the ranks' stderr:\n" + "\n".join(tail) if tail else ""
            raise RuntimeError(f"torchrun training of {model!r} on {n} ranks failed (exit {code}); "
                               f"see the rank logs above. Command: {' '.join(cmd)}{last}")
        if not (out / "summary.json").exists():
            return {"interrupted": True, "model": model}
    summary = json.loads((out / "summary.json").read_text())
    summary["seconds"] = time.perf_counter() - started
    summary["model_dir"] = str(out)
    return summary


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
    loader = BatchLoader(config, find_table(paths), net.dense_stats, split, shuffle=False, batch_size=8192, num_workers=0)
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
