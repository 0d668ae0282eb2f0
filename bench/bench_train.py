"""Training benchmark: model quality (teacher vs baselines vs oracle) and training throughput
(TorchRec on 1 and 2 ranks vs a plain-PyTorch nn.EmbeddingBag build of the same network, and
the scale-out launch: 2 torchrun nodes of one rank each on loopback vs 1 node).

    nice .venv/bin/python bench/bench_train.py --rows 1000000            # quality + throughput
    nice .venv/bin/python bench/bench_train.py --rows 200000 --skip-quality
    nice .venv/bin/python bench/bench_train.py --rows 200000 --skip-quality --runs torchrec_1rank,torchrec_2ranks,torchrec_2nodes

Prints figures with the machine and the comparison in the same run; asserts nothing.
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
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lattice.config import PlatformConfig, load_config  # noqa: E402
from lattice.paths import Paths  # noqa: E402


def prepare(config: PlatformConfig, rows: int, workdir: Path, have_training_set: bool = False) -> tuple[PlatformConfig, Paths]:
    """The config pointed at `workdir`; the synthetic logs and the pandas table are written unless
    a feature-stage training set is linked in (the loader reads that in preference, and at 10M rows
    the pandas table alone takes many minutes)."""
    from lattice.data.local_table import write_local_table
    from lattice.data.synth import generate

    raw = workdir / "raw"
    config = config.model_copy(update={"data_root": str(raw)})
    paths = Paths.for_config(config, workdir / "work")
    if have_training_set:
        return config, paths
    manifest = raw / "manifest.json"
    if not (manifest.exists() and json.loads(manifest.read_text()).get("rows") == rows):
        t = time.perf_counter()
        generate(config, rows, raw, progress=True)
        print(f"generated {rows:,} rows in {time.perf_counter() - t:.0f}s")
    if not paths.consolidated.exists():
        t = time.perf_counter()
        write_local_table(config, paths)
        print(f"consolidated (pandas reference) in {time.perf_counter() - t:.0f}s")
    return config, paths


# ---------------------------------------------------------------- quality


def quality(config: PlatformConfig, paths: Paths, models: list[str], nproc: int, epochs: int | None,
            baseline_nproc: int | None = None, label: str = "") -> dict:
    """Train each model on the same training set; print the per-cell table, macro NE per
    objective and whether the teacher beats every baseline; return the figures."""
    from lattice.cli.train_cmd import summary_table
    from lattice.training.stages import train
    from lattice.trees.fit import fit_trees_if_on

    metrics = {}
    fit_trees_if_on(config, paths)  # the leaf features' trees (models.leaves), as the pipeline's fit_trees
    for m in models:
        t = time.perf_counter()
        ranks = nproc if m == "teacher" or baseline_nproc is None else baseline_nproc
        s = train(config, paths, model=m, nproc=ranks, epochs=epochs, progress=False)
        print(f"{label}{m}: {time.perf_counter() - t:.0f}s, best epoch {s['best_epoch']}, macro NE {s['macro']['ne']:.4f}", flush=True)
        metrics[m] = json.loads((paths.model_dir(m) / "metrics.json").read_text())
    print(f"\n{label}test NE per (domain, objective)\n" + summary_table(config, metrics))
    by_obj = {m: {o: v["ne"] for o, v in x["by_objective"].items()} for m, x in metrics.items()}
    print("macro NE per objective: " + "; ".join(f"{m} " + ", ".join(f"{o} {ne:.4f}" for o, ne in objs.items())
                                                 for m, objs in by_obj.items()))
    out = {"macro_ne_by_objective": by_obj, "cells": {m: {c: v["ne"] for c, v in x["cells"].items()} for m, x in metrics.items()}}
    if "teacher" in metrics:
        t = metrics["teacher"]
        gap = {c: (v["ne"] / v["oracle_ne"] - 1) for c, v in t["cells"].items() if v.get("oracle_ne")}
        if len(metrics) > 1:  # with no baseline in the run there is nothing to beat
            beats = {o: all(by_obj["teacher"][o] < by_obj[b][o] for b in by_obj if b != "teacher") for o in config.objective_names}
            out["teacher_beats_every_baseline_per_objective"] = beats
            print("teacher beats every baseline on macro NE per objective:", beats)
        if gap:  # only data with truth columns has an oracle
            out["teacher_vs_oracle_relative_gap"] = gap
            print("teacher NE / oracle NE - 1 per cell:", {c: f"{g:+.1%}" for c, g in gap.items()}, "(goal: within +3%)")
    return out


# ---------------------------------------------------------------- throughput


class PlainEBC(nn.Module):
    """The same tables as the TorchRec EmbeddingBagCollection, as plain nn.EmbeddingBag modules
    (sparse gradients, updated by torch.optim.Adagrad): the no-TorchRec baseline."""

    def __init__(self, ebc):
        super().__init__()
        self.keys = [c.feature_names[0] for c in ebc.embedding_bag_configs()]
        self.bags = nn.ModuleList([nn.EmbeddingBag(c.num_embeddings, c.embedding_dim, mode="sum", sparse=True, include_last_offset=True)
                                   for c in ebc.embedding_bag_configs()])

    def forward(self, kjt):
        from torchrec.sparse.jagged_tensor import KeyedTensor

        d = kjt.to_dict()
        outs = [bag(d[k].values(), d[k].offsets()) for k, bag in zip(self.keys, self.bags)]  # F x (B, d_f)
        return KeyedTensor.from_tensor_list(self.keys, outs)


def _batches(config, paths, n: int):
    from lattice.data.loader import BatchLoader, find_table, fit_dense_stats

    root = find_table(paths)
    stats = fit_dense_stats(config, root)
    it = iter(BatchLoader(config, root, stats, "train", num_workers=0))
    return [next(it) for _ in range(n)], len(stats.columns), stats


def throughput_worker(args) -> None:
    """One rank of the throughput run (torchrun or in-process): batches are preloaded so only the
    model step is timed."""
    from torchrec import EmbeddingBagCollection
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from lattice.models import build_model
    from lattice.training import distributed as D
    from lattice.training.loop import SPARSE_OPTIMIZERS
    from lattice.training.loss import mdmo_loss

    config = load_config(args.config, args.overrides).model_copy(update={"data_root": str(Path(args.workdir) / "raw")})
    config = config.model_copy(update={"training": config.training.model_copy(update={"batch_size": args.batch_size})})
    paths = Paths.for_config(config, Path(args.workdir) / "work")
    rank, world, _ = D.init_process_group() if args.impl == "torchrec" else (0, 1, False)
    batches, n_dense, stats = _batches(config, paths, args.steps + 3)
    torch.manual_seed(0)
    model = build_model(config, "teacher", n_dense)
    model.set_output_bias(stats.label_rates)
    tr = config.training
    if args.impl == "torchrec":
        tables = [p for m in model.modules() if isinstance(m, EmbeddingBagCollection) for p in m.parameters()]
        apply_optimizer_in_backward(SPARSE_OPTIMIZERS["adagrad"], tables, {"lr": tr.lr_sparse})
        model = D.wrap(model, D.make_plan(model, world, D.sharding_types(tr.sharding_types)))
        opts = [torch.optim.Adam([p for _, p in in_backward_optimizer_filter(model.named_parameters())], lr=tr.lr_dense)]
    else:
        model.sparse.ebc = PlainEBC(model.sparse.ebc)
        sparse = list(model.sparse.ebc.parameters())
        ids = {id(p) for p in sparse}
        opts = [torch.optim.Adagrad(sparse, lr=tr.lr_sparse), torch.optim.Adam([p for p in model.parameters() if id(p) not in ids], lr=tr.lr_dense)]

    def step(b):
        loss = mdmo_loss(config, model(*b.inputs()), b).total
        for o in opts:
            o.zero_grad()
        loss.backward()
        for o in opts:
            o.step()

    for b in batches[:3]:  # warm-up
        step(b)
    t = time.perf_counter()
    n = 0
    for b in batches[3:]:
        step(b)
        n += len(b)
    secs = time.perf_counter() - t
    if args.impl == "torchrec" and world > 1:
        import torch.distributed as dist

        tot = torch.tensor([float(n), secs])
        dist.all_reduce(tot)
        n, secs = tot[0].item(), tot[1].item() / world
    if rank == 0:
        print(json.dumps({"impl": args.impl, "world": world, "examples": n, "seconds": secs, "examples_per_s": n / secs}))


RUNS = {  # name -> (implementation, nodes, ranks per node, threads per rank)
    "plain_1thread": ("plain", 1, 1, 1),
    "plain_2threads": ("plain", 1, 1, 2),  # plain PyTorch on the same two cores the 2-rank run uses
    "torchrec_1rank": ("torchrec", 1, 1, 1),
    "torchrec_2ranks": ("torchrec", 1, 2, 1),
    # the scale-out launch: two torchrun "nodes" of one rank each, c10d rendezvous on loopback
    # (on one machine this measures the launcher and rendezvous, not a second host's cores)
    "torchrec_2nodes": ("torchrec", 2, 1, 1),
}
RATIOS = [("torchrec_2ranks", "plain_1thread"), ("torchrec_2ranks", "plain_2threads"), ("torchrec_1rank", "plain_1thread"),
          ("torchrec_2nodes", "torchrec_1rank"), ("torchrec_2nodes", "torchrec_2ranks")]


def _launch(nodes: int, ranks: int, script: list[str], env: dict) -> subprocess.CompletedProcess:
    """One throughput run: in-process, one torchrun, or one torchrun per loopback node, each with
    the launcher options `lattice train` uses for that layout (`lattice.training.launch`)."""
    from lattice.training.launch import Launch, free_port

    if nodes == ranks == 1:
        return subprocess.run([sys.executable] + script, env=env, capture_output=True, text=True)
    endpoint = None if nodes == 1 else f"127.0.0.1:{free_port()}"
    lay = Launch(nodes, ranks, endpoint, True, f"bench{os.getpid()}{time.monotonic_ns()}")
    procs = [subprocess.Popen(lay.torchrun(i) + script, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(nodes)]
    outs = [p.communicate() for p in procs]
    code = next((p.returncode for p in procs if p.returncode), 0)
    return subprocess.CompletedProcess(procs[0].args, code, outs[0][0], "\n".join(e for _, e in outs))


def throughput(args) -> dict:
    """Every run `--repeats` times, the rounds interleaved so that a noisy spell on this shared
    machine hits every implementation alike; medians of examples/s and of the per-round ratios."""
    common = ["--throughput-worker", "--config", args.config, "--workdir", args.workdir, "--steps", str(args.steps),
              "--batch-size", str(args.batch_size), "--rows", str(args.rows)] + [f"--set={o}" for o in args.overrides]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rounds: list[dict] = []
    for r in range(args.repeats):
        got = {}
        for name, (impl, nodes, ranks, threads) in RUNS.items():
            if args.runs and name not in args.runs.split(","):
                continue
            res = _launch(nodes, ranks, [__file__] + common + ["--impl", impl], {**env, "OMP_NUM_THREADS": str(threads)})
            line = [x for x in res.stdout.splitlines() if x.startswith("{")]
            if res.returncode or not line:
                print(f"{name} failed:\n{res.stderr[-2000:]}")
                continue
            got[name] = json.loads(line[-1])["examples_per_s"]
        rounds.append(got)
        print(f"round {r + 1}/{args.repeats}: " + ", ".join(f"{k} {v:,.0f}" for k, v in got.items()) + " examples/s", flush=True)
    med = {k: float(np.median([g[k] for g in rounds if k in g])) for k in RUNS if any(k in g for g in rounds)}
    ratios = {f"{a}/{b}": float(np.median([g[a] / g[b] for g in rounds if a in g and b in g]))
              for a, b in RATIOS if a in med and b in med}
    print(f"\nmedian of {args.repeats} rounds, {args.batch_size} examples per rank per step:")
    for k, v in med.items():
        print(f"  {k:16s} {v:>10,.0f} examples/s")
    for k, v in ratios.items():
        print(f"  {k:32s} {v:.2f}x" + (" (goal >= 1.5x)" if "plain" in k else ""))
    return {"rounds": rounds, "median_examples_per_s": med, "median_ratios": ratios, "batch_size_per_rank": args.batch_size}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--workdir", default=None, help="default: .lattice/bench_train_<rows>")
    p.add_argument("--models", default="teacher,separate,pooled,mmoe")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--seed", type=int, default=None, help="training.seed for every model (default: the config's)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="a config change for this run (repeatable), e.g. --set models.teacher.experts=8")
    p.add_argument("--training-set", default=None,
                   help="a feature-stage training set folder (with the history aggregates) to train on instead of the "
                        "generated pandas table; e.g. bench_pipeline.py's <workdir>/wd_1000000/training_set")
    p.add_argument("--steps", type=int, default=30, help="timed steps per throughput run")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds of the throughput runs (medians reported)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--runs", default=None, help=f"throughput runs to time, comma-separated (default: all of {', '.join(RUNS)})")
    p.add_argument("--skip-quality", action="store_true")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--throughput-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", default="torchrec", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.workdir = args.workdir or str(ROOT / ".lattice" / f"bench_train_{args.rows}")
    if args.throughput_worker:
        return throughput_worker(args)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, rows {args.rows:,}")
    if args.training_set:  # the loader reads the training set in preference to the consolidated table
        link = Path(args.workdir) / "work" / "training_set"
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(Path(args.training_set).resolve())
    config, paths = prepare(load_config(args.config, args.overrides), args.rows, Path(args.workdir), bool(args.training_set))
    if args.seed is not None:  # seed-to-seed spread is the noise floor for every comparison below
        config = config.model_copy(update={"training": config.training.model_copy(update={"seed": args.seed})})
    print(f"training seed {config.training.seed}")
    result: dict = {"rows": args.rows, "cores": os.cpu_count()}
    if not args.skip_throughput:
        result["throughput"] = throughput(args)
    if not args.skip_quality:
        result["quality"] = quality(config, paths, args.models.split(","), args.nproc, args.epochs)
    out = Path(args.workdir) / "bench_train.json"
    out.write_text(json.dumps(result, indent=1, default=str))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
