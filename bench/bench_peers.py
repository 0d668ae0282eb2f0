"""Lattice vs peer libraries on the same split and the same rows: the platform's teacher (and its
MMoE baseline), its LightGBM baselines (`gbdt` pooled per objective, `gbdt_cell` per cell), and
torch-rechub 0.9.0's multi-task models (MMOE, PLE, SharedBottom; ESMM when an objective has
`given:`), all on the training set the platform's feature stage writes (its `split` column).

    nice .venv/bin/python bench/bench_peers.py                          # every shipped real-data config
    nice .venv/bin/python bench/bench_peers.py --configs configs/mind.yaml,configs/douban.yaml --epochs 1
    nice .venv/bin/python bench/bench_peers.py --configs configs/avazu.yaml --epochs 2 --seeds 0,1 --reuse
    nice .venv/bin/python bench/bench_peers.py --configs configs/taobao.yaml --epochs 1 --esmm buy=engage

torch-rechub is a bench extra (`pip install -e .[bench]` would pull CUDA torch: install it with
`.venv/bin/pip install --no-deps torch-rechub==0.9.0`); without it the rechub rows are skipped.
The rechub models read the platform's encoded rows (lattice.training.gbdt_stage.read_rows): each
sparse id mapped to a contiguous index fitted on the train split (unseen or missing -> 0), the
domain as one more sparse feature, the dense columns after the platform's transform and
standardisation (fitted on train) as one DenseFeature (ESMM takes sparse features only). They
train with a minimal loop (MTLTrainer has no per-row label mask): Adam at MTLTrainer's defaults
(lr 1e-3, `--rechub-lr`; weight decay 1e-5), the config's batch size, epochs and loss weights, BCE over the rows
where mask_<objective> = 1, the towers' output biases started at the train base rate's logit and
the best validation epoch's weights kept, as the platform trainer does (with rechub's zero biases,
1-2 epochs at lr 1e-3 leave a 5% label's predictions near 0.5: NE about 3 on MIND).
NE is lattice.evaluation.metrics.cell_metrics for every model. After each table, every model's macro
NE per objective minus the teacher's on the same test rows (first seed), with the paired bootstrap
95% interval of `lattice evaluate`, and whether the teacher is best or within noise of the best. Examples/s: training examples over
training seconds (validation and data setup excluded). Threads: the platform's torch models choose
their intra-op threads as `lattice train` does (`training.threads` 0: from the model's dense FLOPs
per step), the rechub models run on the number the Lattice teacher chose for the same data (the same
cores and layout), LightGBM on every core; `--threads N` puts every model on N. For the boosters, train rows fitted per second
of lgb.train (all rounds). The JSON keeps each epoch's rate too (the Lattice teacher on MIND,
2026-12-03: 13.2k, 10.5k, 13.2k examples/s; in 2026-11 its first epoch ran at a tenth of its second). Prints one table per dataset; figures in .lattice/bench/bench_peers.json.
Asserts nothing. These samples are small (3k-85k rows): a cell with few positives has a noisy NE.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

REAL_CONFIGS = "configs/mind.yaml,configs/douban.yaml,configs/avazu.yaml,configs/criteo.yaml,configs/taobao.yaml"
RECHUB_PIP = ".venv/bin/pip install --no-deps torch-rechub==0.9.0"


def rechub_available() -> bool:
    try:
        import torch_rechub.models.multi_task  # noqa: F401
    except ImportError as e:
        print(f"torch-rechub not importable ({e}): skipping the rechub rows; install it with `{RECHUB_PIP}`", flush=True)
        return False
    return True


# ---------------------------------------------------------------- platform models


def run_lattice(config, paths, models: list[str], epochs: int | None, label: str) -> dict:
    """Train through the platform (bench_train.quality: same trainer, table and metrics as
    `lattice train`); examples/s from each run's history (torch) or from timing lgb.train."""
    import lattice.training.gbdt_stage as gbdt_stage
    from bench_train import quality

    fit_log: list[tuple[int, float]] = []
    fit_booster = gbdt_stage.fit_booster

    def timed_fit(params, settings, features, x, y, *rest):
        t = time.perf_counter()
        out = fit_booster(params, settings, features, x, y, *rest)
        fit_log.append((len(y), time.perf_counter() - t))
        return out

    gbdt_stage.fit_booster = timed_fit
    out = {}
    try:
        for m in models:  # one quality() per model, so each booster's timings stay apart
            fit_log.clear()
            q = quality(config, paths, [m], nproc=1, epochs=epochs, label=label)
            summary = json.loads((paths.model_dir(m) / "summary.json").read_text())
            hist = summary.get("history") or []
            if hist:
                n, secs = sum(h["examples"] for h in hist), sum(h["examples"] / h["examples_per_s"] for h in hist)
            else:
                n, secs = sum(r for r, _ in fit_log), sum(s for _, s in fit_log)
            preds = pd.read_parquet(paths.model_dir(m) / "predictions.parquet")
            out[f"lattice {m}"] = {
                "test_predictions": preds, "cells": q["cells"][m], "by_objective": q["macro_ne_by_objective"][m], "train_examples": int(n),
                "train_seconds": secs, "examples_per_s": n / max(secs, 1e-9), "epoch_examples_per_s": [h["examples_per_s"] for h in hist],
                "threads": summary.get("threads")}
    finally:
        gbdt_stage.fit_booster = fit_booster
    return out


# ---------------------------------------------------------------- torch-rechub


def rechub_inputs(config, paths) -> tuple[dict, np.ndarray, list[str], dict]:
    """The platform's rows -> rechub inputs: {feature: array}, split names, sparse feature names,
    vocabulary sizes (index 0 = unseen in train, or missing)."""
    from lattice.data.loader import find_table, fit_dense_stats
    from lattice.training.gbdt_stage import read_rows

    table = find_table(paths)
    arrs, split = read_rows(config, table, fit_dense_stats(config, table))
    train = split == "train"
    x, vocab = {}, {}
    columns = {"domain": (arrs["domain"], np.ones(len(split), bool))}
    columns |= {f.name: (arrs[f"id:{f.name}"], arrs[f"has:{f.name}"]) for f in config.features.sparse}
    for name, (ids, has) in columns.items():
        seen = np.unique(ids[train & has])
        pos = np.clip(np.searchsorted(seen, ids), 0, max(len(seen) - 1, 0))
        found = has & (seen[pos] == ids) if len(seen) else np.zeros(len(ids), bool)
        x[name] = np.where(found, pos + 1, 0).astype(np.int64)
        vocab[name] = len(seen) + 1
    if arrs["dense"].shape[1]:
        x["dense"] = arrs["dense"].astype(np.float32)
    targets = {k: arrs[k] for k in arrs if k.startswith(("label:", "mask:"))}
    return {"x": x, "y": targets, "domain": arrs["domain"], "example_id": arrs["example_id"]}, split, list(columns), vocab


def rechub_models(config, sparse: list[str], vocab: dict, n_dense: int, esmm: tuple[str, str] | None = None) -> dict:
    """name -> (a function that builds the module, its (output column, objective) pairs). Sizes
    follow the platform's baselines (models.baselines.size): 4 experts of [128, 64] (PLE: 2 per
    objective and 2 shared, on 2 levels), towers of head_dims, embeddings of embedding_dim for
    every sparse feature (ESMM needs one width). ESMM runs on the config's first `given:` chain, or
    on `esmm` = (chained objective, given objective) when the platform's config has none."""
    from torch_rechub.basic.features import DenseFeature, SparseFeature
    from torch_rechub.models.multi_task import ESMM, MMOE, PLE, SharedBottom

    size = config.models.baselines.size
    dim, objs = size.embedding_dim, config.objective_names

    def sp() -> list:  # fresh Feature objects per model: a SparseFeature caches its nn.Embedding
        return [SparseFeature(n, vocab_size=vocab[n], embed_dim=dim) for n in sparse]

    def feats() -> list:
        return sp() + ([DenseFeature("dense", embed_dim=n_dense)] if n_dense else [])

    tasks = ["classification"] * len(objs)
    expert = {"dims": [128, 64]}
    towers = [{"dims": list(size.head_dims)} for _ in objs]
    every = list(enumerate(objs))
    out = {"rechub_mmoe": (lambda: MMOE(feats(), tasks, 4, expert, towers), every),
           # two extraction levels: with one level and one objective, PLE's 2 + 2 experts under one gate are MMoE's 4
           "rechub_ple": (lambda: PLE(feats(), tasks, n_level=2, n_expert_specific=2, n_expert_shared=2,
                                      expert_params=expert, tower_params_list=towers), every),
           "rechub_sharedbottom": (lambda: SharedBottom(feats(), tasks, bottom_params=expert, tower_params_list=towers), every)}
    pair = [esmm[::-1]] if esmm and set(esmm) <= set(objs) else []  # a dataset without that pair runs no ESMM
    chained = [(o.given, o.name) for o in config.objectives if o.given] or pair
    if chained:  # ESMM outputs [cvr, ctr, ctcvr]: ctr is P(given), ctcvr the chained objective (every impression)
        given, name = chained[0]

        def esmm():
            f = sp()
            users = [x for x in f if "user" in x.name] or f[: len(f) // 2]
            return ESMM(users, [x for x in f if x not in users], {"dims": list(size.head_dims)}, {"dims": list(size.head_dims)})

        out["rechub_esmm"] = (esmm, [(1, given), (2, name)])
    return out


def logit(rate: float) -> float:
    r = min(max(rate, 1e-6), 1 - 1e-6)
    return math.log(r / (1 - r))


def train_rechub(config, make, heads, data: dict, split: np.ndarray, epochs: int, seed: int, lr: float = 1e-3) -> dict:
    """Minimal loop on rechub's module: masked BCE, best validation epoch kept, test scored."""
    from lattice.evaluation.metrics import cell_metrics

    rates = {o: float((data["y"][f"label:{o}"] * data["y"][f"mask:{o}"])[split == "train"].sum()
                      / max(data["y"][f"mask:{o}"][split == "train"].sum(), 1)) for o in config.objective_names}
    torch.manual_seed(seed)
    model = make()
    with torch.no_grad():  # output biases at the train base rate, as the platform's heads start (set_output_bias)
        if hasattr(model, "towers"):
            for col, o in heads:
                model.towers[col].mlp[-1].bias.fill_(logit(rates[o]))
        else:  # ESMM: ctr = P(given), cvr = P(chained | given)
            (_, given), (_, name) = heads
            model.tower_ctr.mlp[-1].bias.fill_(logit(rates[given]))
            model.tower_cvr.mlp[-1].bias.fill_(logit(rates[name] / max(rates[given], 1e-6)))
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=1e-5)
    weights = {o.name: o.loss_weight for o in config.objectives}
    tensors = {k: torch.from_numpy(v) for k, v in data["x"].items()}
    y = {k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in data["y"].items()}
    train_idx = np.flatnonzero(split == "train")
    bs = config.training.batch_size
    rng = np.random.default_rng(seed)

    @torch.no_grad()
    def predict(name: str) -> pd.DataFrame:
        model.eval()
        idx = torch.from_numpy(np.flatnonzero(split == name))
        probs = torch.cat([model({k: v[idx[i:i + 4096]] for k, v in tensors.items()}) for i in range(0, len(idx), 4096)])
        frame = {"example_id": data["example_id"][idx.numpy()],
                 "domain": np.asarray(config.domain_names, object)[data["domain"][idx.numpy()]]}
        for o in config.objective_names:
            frame[f"p_{o}"] = np.full(len(idx), rates[o])  # an objective the model has no head for: its base rate
            frame[f"label_{o}"], frame[f"mask_{o}"] = data["y"][f"label:{o}"][idx.numpy()], data["y"][f"mask:{o}"][idx.numpy()]
        for col, o in heads:
            frame[f"p_{o}"] = probs[:, col].double().numpy()
        return pd.DataFrame(frame)

    best, best_state, n, secs, per_epoch = float("inf"), None, 0, 0.0, []
    for _ in range(epochs):
        model.train()
        order = torch.from_numpy(rng.permutation(train_idx))
        t, n0 = time.perf_counter(), n
        for i in range(0, len(order), bs):
            b = order[i:i + bs]
            if len(b) < 2:  # BatchNorm needs two rows in training mode
                continue
            p = model({k: v[b] for k, v in tensors.items()}).clamp(1e-7, 1 - 1e-7)
            loss = p.new_zeros(())
            for col, o in heads:
                m = y[f"mask:{o}"][b]
                loss = loss + weights[o] * (F.binary_cross_entropy(p[:, col], y[f"label:{o}"][b], reduction="none") * m).sum() / m.sum().clamp(min=1)
            opt.zero_grad()
            (loss / len(heads)).backward()
            opt.step()
            n += len(b)
        dt = time.perf_counter() - t
        secs += dt
        per_epoch.append((n - n0) / max(dt, 1e-9))
        val = cell_metrics(config, predict("validation"))["macro"]["ne"]
        if val < best or best_state is None:
            best, best_state = val, copy.deepcopy(model.state_dict())
    model.load_state_dict(best_state)
    test = predict("test")
    metrics = cell_metrics(config, test)
    return {"test_predictions": test, "cells": {c: v["ne"] for c, v in metrics["cells"].items()}, "by_objective": {o: v["ne"] for o, v in metrics["by_objective"].items()},
            "train_examples": n, "train_seconds": secs, "examples_per_s": n / max(secs, 1e-9), "epoch_examples_per_s": per_epoch,
            "val_macro_ne": best}


# ---------------------------------------------------------------- driver


def table(config, rows: dict[str, list[dict]]) -> str:
    """Rows: models (mean over seeds); columns: test NE per cell, macro NE per objective, examples/s."""
    cells = [f"{d}/{o}" for d, o in config.cells()]
    head = ["model"] + cells + [f"macro {o}" for o in config.objective_names] + ["examples/s"]
    mean = lambda xs: float(np.nanmean(xs)) if len(xs) else float("nan")  # noqa: E731
    body = []
    for name, runs in rows.items():
        body.append([name] + [f"{mean([r['cells'].get(c, np.nan) for r in runs]):.4f}" for c in cells]
                    + [f"{mean([r['by_objective'][o] for r in runs]):.4f}" for o in config.objective_names]
                    + [f"{mean([r['examples_per_s'] for r in runs]):,.0f}"])
    widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
    line = lambda r: "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in body])


def versus_reference(config, rows: dict[str, list[dict]], reference: str = "lattice teacher") -> dict:
    """The goal's check on the first seed's test rows: per objective, NE(model) - NE(reference) with
    the paired bootstrap 95% interval (lattice.evaluation.compare), for every other model; the
    reference meets the goal on an objective when no model is better by more than noise."""
    from lattice.evaluation.compare import RowsDiffer, paired_bootstrap

    if reference not in rows:
        return {}
    ref = rows[reference][0]["test_predictions"]
    pairs = {}
    for name, runs in rows.items():
        if name == reference:
            continue
        try:
            pairs[name] = paired_bootstrap(config, ref, runs[0]["test_predictions"])["by_objective"]
        except RowsDiffer as e:
            pairs[name] = {"error": str(e)}
    met = {o: not any(v.get(o, {}).get("verdict") == "B better" for v in pairs.values()) for o in config.objective_names}
    return {"reference": reference, "pairs": pairs, "met": met}


def versus_lines(found: dict) -> str:
    if not found:
        return ""
    lines = [f"NE(model) - NE({found['reference']}) per objective on the same test rows, paired bootstrap 95% interval "
             "(negative: the model is better)"]
    for name, objs in found["pairs"].items():
        if "error" in objs:
            lines.append(f"  {name}: not compared: {objs['error']}")
            continue
        lines.append(f"  {name}: " + "; ".join(f"{o} {v['ne_diff']:+.4f} [{v['low']:+.4f}, {v['high']:+.4f}] {v['verdict']}"
                                              for o, v in objs.items()))
    lines.append(f"{found['reference']} best or within noise of the best, per objective: {found['met']}")
    return "\n".join(lines) + "\n"


def run_dataset(cfg_file: str, args, with_rechub: bool) -> dict:
    from lattice.config import load_config
    from lattice.paths import Paths

    from lattice.training.gbdt_stage import machine_threads

    pinned = [f"training.threads={args.threads}"] if args.threads else []
    overrides = [f"models.baselines.trees.num_threads={args.threads or machine_threads()}", *pinned, *args.overrides]
    config = load_config(cfg_file, overrides)
    paths = Paths.for_config(config, Path(args.workdir) / config.name)
    paths.ensure()
    if not (args.reuse and paths.training_set.exists() and any(paths.training_set.rglob("*.parquet"))):
        # `lattice features` in its own process: a Spark JVM left in this one made the next training
        # run's first epoch 30x slower (Avazu teacher: 194 against 5,785 examples/s)
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "lattice.cli", "features", cfg_file, "--workdir", str(paths.workdir)],
                           capture_output=True, text=True)
        done = [line for line in r.stdout.splitlines() if line.startswith("training set:")]
        if not done:
            raise SystemExit(f"[{config.name}] lattice features failed (rc {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        print(f"[{config.name}] features ({time.perf_counter() - t:.0f}s): {done[0]}", flush=True)
    epochs = args.epochs or config.training.epochs
    rows: dict[str, list[dict]] = {}
    data = None
    threads: dict[str, int | None] = {}
    for seed in args.seeds:
        cfg = load_config(cfg_file, overrides + [f"training.seed={seed}"])
        for name, r in run_lattice(cfg, paths, args.lattice_models, epochs, f"[{config.name} seed {seed}] ").items():
            rows.setdefault(name, []).append(r | {"seed": seed, "load_avg": os.getloadavg()[0]})
            threads[name] = r["threads"]
        if not with_rechub:
            continue
        # rechub on the teacher's layout: the same cores, split the same way
        rechub_threads = args.threads or threads.get("lattice teacher") or torch.get_num_threads()
        torch.set_num_threads(rechub_threads)
        threads["rechub"] = rechub_threads
        if data is None:
            t = time.perf_counter()
            data, split, sparse, vocab = rechub_inputs(cfg, paths)
            print(f"[{config.name}] rechub inputs: {len(split):,} rows ({', '.join(f'{s} {int((split == s).sum()):,}' for s in ('train', 'validation', 'test'))}), "
                  f"vocabularies {vocab} ({time.perf_counter() - t:.0f}s)", flush=True)
        n_dense = data["x"]["dense"].shape[1] if "dense" in data["x"] else 0
        for name, (make, heads) in rechub_models(cfg, sparse, vocab, n_dense, args.esmm).items():
            t = time.perf_counter()
            r = train_rechub(cfg, make, heads, data, split, epochs, seed, args.rechub_lr)
            print(f"[{config.name} seed {seed}] {name}: {time.perf_counter() - t:.0f}s, val macro NE {r['val_macro_ne']:.4f}, "
                  f"test {', '.join(f'{o} {v:.4f}' for o, v in r['by_objective'].items())}", flush=True)
            rows.setdefault(name, []).append(r | {"seed": seed, "load_avg": os.getloadavg()[0]})
    print(f"\n[{config.name}] test NE per (domain, objective), macro NE per objective, training examples/s "
          f"({epochs} epoch(s), seeds {','.join(map(str, args.seeds))}, torch threads {threads})\n" + table(config, rows) + "\n", flush=True)
    found = versus_reference(config, rows)
    print(versus_lines(found), flush=True)
    for runs in rows.values():  # the predictions are for the intervals, not for the JSON
        for r in runs:
            r.pop("test_predictions", None)
    return {"epochs": epochs, "threads": threads, "seeds": args.seeds, "models": rows, "versus_teacher": found}


def main() -> None:
    from lattice.training.gbdt_stage import machine_threads

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default=REAL_CONFIGS)
    p.add_argument("--epochs", type=int, default=None, help="default: each config's training.epochs")
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0])
    p.add_argument("--threads", type=int, default=None,
                   help=f"torch and LightGBM threads for every model (default: each platform model chooses, as `lattice train` "
                        f"does; rechub takes the teacher's choice; LightGBM {machine_threads()})")
    p.add_argument("--lattice-models", type=lambda s: [m for m in s.split(",") if m], default=["teacher", "mmoe", "gbdt", "gbdt_cell"])
    p.add_argument("--no-rechub", action="store_true", help="platform models only")
    p.add_argument("--rechub-lr", type=float, default=1e-3, help="Adam learning rate of the rechub models (MTLTrainer's default)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="a config change for every model (repeatable; not for the feature stage), e.g. --set objectives.buy.given=engage")
    p.add_argument("--esmm", type=lambda s: tuple(s.split("=")), default=None, metavar="CHAINED=GIVEN",
                   help="run rechub's ESMM on this pair of objectives while the platform's models keep the config "
                        "as shipped, e.g. --esmm buy=engage (default: the config's own `given:` chain, if any)")
    p.add_argument("--workdir", default=str(ROOT / ".lattice" / "bench_peers"))
    p.add_argument("--reuse", action="store_true", help="keep a training set an earlier run built")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}, torch {torch.__version__}, "
          f"threads {args.threads or 'chosen per model'}, load avg {os.getloadavg()[0]:.1f}", flush=True)
    with_rechub = not args.no_rechub and rechub_available()
    out = {}
    for cfg in args.configs.split(","):
        out[Path(cfg).stem] = run_dataset(cfg, args, with_rechub)
    dest = ROOT / ".lattice" / "bench" / "bench_peers.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=2))
    print(f"figures written to {dest}")


if __name__ == "__main__":
    main()
