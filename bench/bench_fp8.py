"""FP8 benchmark: per-(domain, objective) test NE of the teacher in FP32, FP8 at the dispatcher's
sites, FP8 at every site with the naive per-tensor e4m3 recipe, and each Mod (no hidden biases,
BlockNorm, Hard-Swish) on and off; the share of GEMM FLOPs the dispatcher moved to FP8; the
probe's overhead on the training step.

    nice .venv/bin/python bench/bench_fp8.py --rows 1000000
    nice .venv/bin/python bench/bench_fp8.py --rows 200000 --variants fp32,fp8,naive

Every variant trains on the same synthetic table, split, seed and epochs, in one run (but `seed<N>`:
FP32 at seed N, the run-to-run noise any change sits in); the FP32 teacher is the baseline of every
ratio. On CPU FP8 is emulated (real float8 operands, no speed-up),
so this measures quality; GPU speed is for a device run. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

MODS = {"nobias": "bias=final", "blocknorm": "block_norm=8", "hardswish": "activation=hardswish"}


def variants(names: list[str]) -> dict[str, tuple[list[str], bool]]:
    """variant -> (config --set overrides, naive FP8 plan)."""
    out: dict[str, tuple[list[str], bool]] = {}
    for name in names:
        if name == "fp32":
            out[name] = ([], False)
        elif name == "fp8":
            out[name] = (["fp8.enabled=true"], False)
        elif name == "naive":
            out[name] = (["fp8.enabled=true"], True)
        elif "=" in name:  # <label>=KEY.PATH=VALUE: any other config change, against the same FP32 run
            label, _, setting = name.partition("=")
            out[label] = ([setting], False)
        elif name.startswith("seed"):  # FP32 at another seed: the run-to-run noise the FP8 changes sit in
            out[name] = ([f"training.seed={int(name[4:])}"], False)
        else:  # <mod> or <mod>+fp8
            mod, _, fp8 = name.partition("+")
            if mod not in MODS:
                raise SystemExit(f"unknown variant {name!r}: use fp32, fp8, naive, seed<N>, <label>=KEY.PATH=VALUE, or a mod {sorted(MODS)} optionally +fp8")
            key, value = MODS[mod].split("=")
            sets = [f"models.teacher.{key}={value}"] + (["fp8.enabled=true"] if fp8 else [])
            out[name] = (sets, False)
    return out


def naive_plan(real, model, fp8_config, *args, **kwargs) -> dict:
    """Every site in FP8 with one scale per tensor: the generic recipe LoKA warns about."""
    plan = real(model, fp8_config, *args, **kwargs)
    for s in plan["sites"]:
        s["choice"], s["reason"] = "e4m3_tensor", "naive: every site"
    plan["fp8_flops_share"] = 1.0
    return plan


def dispatched_is_naive(paths) -> bool:
    plan = paths.model_dir("teacher@fp8") / "fp8_plan.json"
    return plan.exists() and all(s["choice"] == "e4m3_tensor" for s in json.loads(plan.read_text())["sites"])


def train_variant(base, paths, name: str, sets: list[str], naive: bool, epochs: int | None) -> dict:
    from lattice.config.loader import apply_overrides, parse_config
    from lattice.training.stages import train
    from lattice.trees.fit import fit_trees_if_on

    config = parse_config(apply_overrides(base.model_dump(mode="json"), sets, "<bench>"), "<bench>") if sets else base
    model = f"teacher@{name.replace('+', '_')}"
    import lattice.fp8.dispatch as dispatch

    real = dispatch.make_plan
    if naive:
        # the trainer plans through lattice.fp8.dispatch.make_plan (in this process at nproc 1)
        dispatch.make_plan = lambda m, c, *a, **k: naive_plan(real, m, c, *a, **k)
    try:
        fit_trees_if_on(config, paths)  # the leaf features' trees (models.leaves), as the pipeline's fit_trees
        t = time.perf_counter()
        summary = train(config, paths, model=model, nproc=1, epochs=epochs, progress=False)
        seconds = time.perf_counter() - t
    finally:
        dispatch.make_plan = real
    metrics = json.loads((paths.model_dir(model) / "metrics.json").read_text())
    plan_file = paths.model_dir(model) / "fp8_plan.json"
    plan = json.loads(plan_file.read_text()) if plan_file.exists() else None
    return {"model": model, "seconds": seconds, "best_epoch": summary.get("best_epoch"),
            "cells": {c: v["ne"] for c, v in metrics["cells"].items()},
            "macro": {o: v["ne"] for o, v in metrics["by_objective"].items()},
            "fp8_sites": sum(1 for s in (plan or {}).get("sites", []) if s["choice"] != "fp32"),
            "sites": len((plan or {}).get("sites", [])), "fp8_flops_share": (plan or {}).get("fp8_flops_share", 0.0)}


def probe_overhead(config, paths, repeats: int, steps: int) -> dict:
    """The probe's share of a training step (forward, backward, optimizer) at `fp8.probe_every`.

    Timing a probe that runs once in `probe_every` steps directly puts a ~1% difference under the
    noise of a shared machine, so each round times the same batches with a probe that updates on
    every step and without one, in alternating order (ABBA: drift cancels), and the overhead is the
    median per-round extra time divided by probe_every (every update costs the same)."""
    import torch

    from lattice.data.loader import BatchLoader, find_table
    from lattice.data.transforms import DenseStats
    from lattice.fp8.dispatch import attach_probes, detach_probes
    from lattice.models import build_model
    from lattice.training.loss import mdmo_loss

    stats = DenseStats.load(paths.model_dir("teacher@fp32") / "dense_stats.json")
    torch.manual_seed(0)
    model = build_model(config, "teacher", len(stats.columns))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = BatchLoader(config, Path(find_table(paths)), stats, "train", batch_size=config.training.batch_size, seed=0)
    batches = [b for _, b in zip(range(steps), loader)]

    def run(probed: bool) -> float:
        if probed:
            attach_probes(model, 1)
        else:
            detach_probes(model)
        t = time.perf_counter()
        for b in batches:
            loss = mdmo_loss(config, model(b.dense, b.sparse, b.domain), b).total
            opt.zero_grad()
            loss.backward()
            opt.step()
        return (time.perf_counter() - t) / len(batches)

    run(False)  # warm-up
    plain, probed = [], []
    for i in range(repeats):
        for with_probe in ((False, True) if i % 2 == 0 else (True, False)):
            (probed if with_probe else plain).append(run(with_probe))
    every = config.fp8.probe_every
    per_update = [q / p - 1 for p, q in zip(plain, probed)]  # an update on every step, relative to the step
    return {"step_ms_plain": 1e3 * statistics.median(plain), "step_ms_probe_every_step": 1e3 * statistics.median(probed),
            "update_cost": statistics.median(per_update), "overhead": statistics.median(per_update) / every,
            "probe_every": every, "repeats": repeats}


def main() -> None:
    from bench_train import prepare

    from lattice.config import load_config

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--epochs", type=int, default=None, help="default: the config's training.epochs")
    p.add_argument("--variants", default="fp32,fp8,naive," + ",".join(f"{m},{m}+fp8" for m in MODS))
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds of the probe-overhead timing")
    p.add_argument("--workdir", default=str(ROOT / ".lattice" / "bench_fp8"))
    p.add_argument("--reuse", action="store_true",
                   help="keep the figures of variants a previous run of the same rows and epochs finished")
    args = p.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}, "
          f"load avg {os.getloadavg()[0]:.1f}", flush=True)
    config, paths = prepare(load_config(args.config), args.rows, Path(args.workdir) / f"rows{args.rows}")
    names = args.variants.split(",")
    if "fp32" not in names:
        names.insert(0, "fp32")
    # figures are written after every variant, so a long run that is stopped keeps what it finished
    partial = Path(args.workdir) / f"rows{args.rows}" / f"results_epochs{args.epochs}.json"
    done = json.loads(partial.read_text()) if args.reuse and partial.exists() else {}
    results = {}
    for name, (sets, naive) in variants(names).items():
        if name in done:
            r = results[name] = done[name]
            print(f"{name}: kept from {partial}", flush=True)
        elif name == "naive" and "fp8" in results and dispatched_is_naive(paths):
            # the same plan trains the same model (one process, seeded): not trained twice
            r = results[name] = done[name] = {**results["fp8"], "model": "teacher@fp8", "same_as": "fp8"}
            partial.write_text(json.dumps(done, indent=2))
            print("naive: the dispatcher chose per-tensor e4m3 at every site, so the naive model is the dispatched one", flush=True)
        else:
            r = results[name] = train_variant(config, paths, name, sets, naive, args.epochs)
            done[name] = r
            partial.write_text(json.dumps(done, indent=2))
        print(f"{name}: {r['seconds']:.0f}s, best epoch {r['best_epoch']}, macro NE "
              + ", ".join(f"{o} {v:.4f}" for o, v in r["macro"].items())
              + (f"; {r['fp8_sites']}/{r['sites']} sites in FP8 ({r['fp8_flops_share']:.0%} of GEMM FLOPs)" if r["sites"] else ""),
              flush=True)
    base = results["fp32"]["cells"]
    print("\ntest NE per (domain, objective), and relative change against FP32")
    print(f"{'cell':<24}" + "".join(f"{n:>22}" for n in results))
    worst = {n: 0.0 for n in results}
    for cell in base:
        row = f"{cell:<24}"
        for n, r in results.items():
            rel = r["cells"][cell] / base[cell] - 1
            worst[n] = max(worst[n], rel)
            row += f"{r['cells'][cell]:>12.4f} ({rel:+.3%})"
        print(row)
    print("worst cell vs FP32: " + ", ".join(f"{n} {w:+.3%}" for n, w in worst.items()))
    if "fp8" in results:
        print(f"dispatched FP8 within 0.1% of FP32 in every cell: {worst['fp8'] <= 0.001}")
    overhead = probe_overhead(config, paths, args.repeats, steps=20)
    print(f"probe overhead: {overhead['overhead']:+.2%} of a training step at probe_every {overhead['probe_every']} "
          f"(an update on every step costs {overhead['update_cost']:+.1%}: {overhead['step_ms_probe_every_step']:.1f} vs "
          f"{overhead['step_ms_plain']:.1f} ms a step, medians of {overhead['repeats']} alternating rounds)")
    dest = ROOT / ".lattice" / "bench" / "bench_fp8.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps({"rows": args.rows, "variants": results, "worst_vs_fp32": worst, "probe": overhead}, indent=2))
    print(f"figures written to {dest}")


if __name__ == "__main__":
    main()
