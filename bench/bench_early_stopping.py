"""Early-stopping defaults by measurement: record each dataset's validation curve once, then replay
candidate stop rules on it offline.

Record: the platform's teacher (lattice.training.stages.train, one process, the config as shipped
otherwise) trains once per dataset and seed for `--epochs` epochs with `--evals-per-epoch`
validations per epoch and a patience that never runs out. At every validation it also scores the
test split with the same weights (the network's raw NE, before the calibration stage, so every
point is comparable), and notes the training seconds and validation seconds spent so far.

Replay: a rule is (cadence c validations per epoch, patience p, epoch cap M). Walking the recorded
points a rule would have seen (every 4/c-th one of 4), it keeps the best validation macro NE and
stops after p + 1 validations in a row without a better one, or at the end of epoch M. Its
figures: the kept point's test macro NE minus that of the shipped behaviour (`--baseline`: the
config's epochs, 1 validation per epoch, patience 2, which never stops in 3 epochs), and its
cost (training seconds to its stop point + its validations at the measured mean validation time)
as a share of the baseline's. A rule is chosen on `--choose` datasets and the same rule is then
reported on the `--confirm` ones, which took no part in the choice.

    nice .venv/bin/python bench/bench_early_stopping.py                  # record + replay (~35 min on 2 loaded cores, half of it `lattice features`)
    nice .venv/bin/python bench/bench_early_stopping.py --choose configs/demo.yaml --confirm "" --reuse --seeds 1   # one seed per call
    nice .venv/bin/python bench/bench_early_stopping.py --replay-only    # replay the recorded curves again
    nice .venv/bin/python bench/bench_early_stopping.py --choose configs/mind.yaml --confirm configs/criteo.yaml --seeds 0

Curves and replay tables go to .lattice/bench/bench_early_stopping.json. Asserts nothing. These
samples are small (3k-85k rows): a validation split of a few hundred rows is noisy, which is
what a patience has to live with.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHOOSE = "configs/avazu.yaml,configs/mind.yaml,configs/douban.yaml"
CONFIRM = "configs/criteo.yaml,configs/taobao.yaml,configs/demo.yaml"
OUT = ROOT / ".lattice" / "bench" / "bench_early_stopping.json"
NEVER = 10_000  # a patience no recorded curve can exhaust


# ---------------------------------------------------------------- record


def _record_hook():
    """Wrap Trainer.evaluate so each new validation also carries the test macro NE of the same
    weights and the seconds spent so far; returns the undo."""
    from lattice.data.loader import BatchLoader
    from lattice.training.loop import Trainer

    original = Trainer.evaluate

    def evaluate(self) -> bool:
        st = self.state
        before, eval_before = len(st.evals), st.eval_seconds
        done = sum(h["examples"] / h["examples_per_s"] for h in st.history) * self.world
        stop = original(self)
        if len(st.evals) == before:  # the epoch ended on an in-epoch point: nothing new
            return stop
        if not hasattr(self, "_bench_test"):  # kept between validations: test is read every time
            self._bench_test = BatchLoader(self.config, Path(self.spec.table), self.stats, "test",
                                           batch_size=self.config.training.batch_size, rank=0, world_size=1,
                                           seed=self.spec.seed, cache=True, days=self.days)
        val_loader = self._loaders[("validation", False)]
        self._loaders[("validation", False)] = self._bench_test
        try:
            test = self.validate()  # the same all-reduced per-cell NE, on the test rows
        finally:
            self._loaders[("validation", False)] = val_loader
            self.model.train()
        finite = [v for v in test.values() if v == v]
        st.evals[-1].update({"test_ne": test, "test_macro_ne": float(np.mean(finite)) if finite else math.inf,
                             "train_seconds": done + st.epoch_seconds, "eval_seconds": st.eval_seconds - eval_before})
        return stop

    Trainer.evaluate = evaluate
    return lambda: setattr(Trainer, "evaluate", original)


def features(cfg_file: str, workdir: Path, env: dict) -> None:
    """`lattice features` in its own process (a Spark JVM left in this one slows the next training
    run's first epoch many times over, bench_peers.py)."""
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "lattice.cli", "features", cfg_file, "--workdir", str(workdir)],
                       capture_output=True, text=True, env=env)
    done = [line for line in r.stdout.splitlines() if line.startswith("training set:")]
    if not done:
        raise SystemExit(f"[{cfg_file}] lattice features failed (rc {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    print(f"[{Path(cfg_file).stem}] features ({time.perf_counter() - t:.0f}s): {done[0]}", flush=True)


def record(cfg_file: str, args) -> dict:
    from lattice.config import load_config
    from lattice.paths import Paths
    from lattice.training.stages import train
    from lattice.trees.fit import fit_trees_if_on

    name = Path(cfg_file).stem
    env = dict(os.environ)
    if name == "demo":  # the demo reads generated logs: made once per --demo-rows
        raw = Path(args.workdir) / "demo_raw"
        env["LATTICE_DEMO_DATA"] = os.environ["LATTICE_DEMO_DATA"] = str(raw)
        manifest = raw / "manifest.json"
        if not (manifest.exists() and json.loads(manifest.read_text()).get("rows") == args.demo_rows):
            subprocess.run([sys.executable, "-m", "lattice.cli", "synth", "--config", cfg_file, "--rows",
                            str(args.demo_rows), "--out", str(raw), "--quiet"], check=True, env=env)
    shipped = load_config(cfg_file)
    paths = Paths.for_config(shipped, Path(args.workdir) / name)
    paths.ensure()
    if not (args.reuse and paths.training_set.exists() and any(paths.training_set.rglob("*.parquet"))):
        features(cfg_file, paths.workdir, env)
    # a constant dense rate (lr_decay_to 1, every shipped real-data config) makes the first epochs
    # of a long run the same as a short run's, so one long run stands for every epoch cap; a
    # decaying one (the demo) is recorded at its own epochs
    epochs = args.epochs if shipped.training.lr_decay_to == 1.0 else shipped.training.epochs
    runs = []
    for seed in args.seeds:
        cfg = load_config(cfg_file, [f"training.epochs={epochs}", f"training.evals_per_epoch={args.evals_per_epoch}",
                                     f"training.early_stopping_patience={NEVER}", f"training.seed={seed}"])
        undo = _record_hook()
        t = time.perf_counter()
        try:
            fit_trees_if_on(cfg, paths)  # the leaf features' trees (models.leaves), as the pipeline's fit_trees
            train(cfg, paths, model="teacher", nproc=1, epochs=epochs, progress=False)
        finally:
            undo()
        evals = json.loads((paths.model_dir("teacher") / "history.json").read_text())["evals"]
        best = min(evals, key=lambda e: e["val_macro_ne"])
        print(f"[{name} seed {seed}] {time.perf_counter() - t:.0f}s, {len(evals)} validations; val macro NE "
              + " ".join(f"{e['val_macro_ne']:.4f}" for e in evals)
              + f"; best validation at epoch {best['epochs_done']:.2f} (test {best['test_macro_ne']:.4f})", flush=True)
        runs.append({"seed": seed, "load_avg": os.getloadavg()[0], "evals": evals})
    return {"epochs": epochs, "config_epochs": shipped.training.epochs, "evals_per_epoch": args.evals_per_epoch,
            "rows": {"batch_size": shipped.training.batch_size}, "runs": runs}


# ---------------------------------------------------------------- replay


def replay(evals: list[dict], per_epoch: int, cadence: int, patience: int, max_epochs: int) -> dict:
    """What a rule would have kept and spent on one recorded curve."""
    stride = per_epoch // cadence
    seen = [e for i, e in enumerate(evals) if (i + 1) % stride == 0 and e["epoch"] <= max_epochs]
    from lattice.training.stopping import observe  # the trainer's own rule

    best, bad, stop_at = None, 0, seen[-1]
    for e in seen:
        step = observe(best["val_macro_ne"] if best else math.inf, bad, e["val_macro_ne"], patience)
        bad = step.bad_evals
        if step.best:
            best = e
        if step.stop:
            stop_at = e
            break
    n_evals = seen.index(stop_at) + 1
    # seconds from the run's mean rates, not the clock at the stop point: on a shared machine a
    # neighbour's burst would otherwise decide between two rules
    mean_eval = float(np.mean([e["eval_seconds"] for e in evals]))
    per_epoch = evals[-1]["train_seconds"] / evals[-1]["epochs_done"]
    return {"test": best["test_macro_ne"], "best_at": best["epochs_done"], "stopped_at": stop_at["epochs_done"],
            "seconds": stop_at["epochs_done"] * per_epoch + n_evals * mean_eval, "epochs_used": stop_at["epochs_done"]}


def rules(max_epochs: int) -> list[tuple[int, int, int]]:
    """(cadence, patience, epoch cap): patience 99 never runs out here (every epoch runs, the best kept)."""
    return [(c, p, m) for c in (1, 2, 4) for p in (0, 1, 2, 3, 4, 6, 99) for m in sorted({2, 3, max_epochs})]


def score(recorded: dict, names: list[str], baseline: tuple[int, int, int | None]) -> dict:
    """Per rule: mean and worst test-NE change against the baseline, and mean time share, over the
    datasets `names` (each the mean over its seeds)."""
    out = {}
    for rule in rules(max(r["epochs"] for r in recorded.values())):
        c, p, m = rule
        per = {}
        for n in names:
            d = recorded[n]
            cap = min(m, d["epochs"])
            base_cap = baseline[2] or d["config_epochs"]
            dne, share, used = [], [], []
            for run in d["runs"]:
                got = replay(run["evals"], d["evals_per_epoch"], c, p, cap)
                base = replay(run["evals"], d["evals_per_epoch"], baseline[0], baseline[1], min(base_cap, d["epochs"]))
                dne.append(got["test"] - base["test"])
                share.append(got["seconds"] / base["seconds"])
                used.append(got["epochs_used"])
            per[n] = {"d_test_ne": float(np.mean(dne)), "time_share": float(np.mean(share)), "epochs_used": float(np.mean(used))}
        out[f"c{c} p{p} e{m}"] = {"cadence": c, "patience": p, "epochs": m, "datasets": per,
                                  "mean_d_test_ne": float(np.mean([v["d_test_ne"] for v in per.values()])),
                                  "worst_d_test_ne": float(np.max([v["d_test_ne"] for v in per.values()])),
                                  "mean_time_share": float(np.mean([v["time_share"] for v in per.values()]))}
    return out


def print_table(title: str, scored: dict, names: list[str], only: list[str] | None = None) -> None:
    print(f"\n{title}: test macro NE change vs the baseline (negative = better) and time share of the baseline")
    print(f"{'rule':<12} {'mean dNE':>9} {'worst dNE':>9} {'time':>6}  " + "  ".join(f"{n:>22}" for n in names))
    for key, r in scored.items():
        if only and key not in only:
            continue
        cells = "  ".join(f"{r['datasets'][n]['d_test_ne']:+.4f} {r['datasets'][n]['time_share']:.2f}x e{r['datasets'][n]['epochs_used']:.1f}"
                          .rjust(22) for n in names)
        print(f"{key:<12} {r['mean_d_test_ne']:+9.4f} {r['worst_d_test_ne']:+9.4f} {r['mean_time_share']:5.2f}x  {cells}")


def choose(scored: dict, tolerance: float) -> str:
    """The cheapest rule whose worst dataset loses at most `tolerance` test NE against the
    baseline; among equally cheap ones (within 5%), the best mean NE. Only rules at the longest
    epoch cap compete: a default patience has to end a run whose user raised `epochs`, so the
    cap must not be what stops it."""
    cap = max(r["epochs"] for r in scored.values())
    scored = {k: r for k, r in scored.items() if r["epochs"] == cap}
    ok = [k for k, r in scored.items() if r["worst_d_test_ne"] <= tolerance]
    if not ok:
        return min(scored, key=lambda k: scored[k]["mean_d_test_ne"])
    cheapest = min(scored[k]["mean_time_share"] for k in ok)
    near = [k for k in ok if scored[k]["mean_time_share"] <= cheapest * 1.05]
    return min(near, key=lambda k: scored[k]["mean_d_test_ne"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--choose", default=CHOOSE, help="configs the rule is chosen on")
    p.add_argument("--confirm", default=CONFIRM, help="configs it is then checked on")
    p.add_argument("--epochs", type=int, default=8, help="epochs recorded (configs with a decaying rate: their own)")
    p.add_argument("--evals-per-epoch", type=int, default=4)
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    p.add_argument("--demo-rows", type=int, default=100_000)
    p.add_argument("--tolerance", type=float, default=0.001,
                   help="test macro NE a rule may lose on its worst choosing dataset against the baseline")
    p.add_argument("--workdir", default=str(ROOT / ".lattice" / "bench_early_stopping"))
    p.add_argument("--reuse", action="store_true", help="keep training sets an earlier run built")
    p.add_argument("--replay-only", action="store_true", help="replay the curves in the JSON; train nothing")
    args = p.parse_args()
    chosen_on = [Path(c).stem for c in args.choose.split(",") if c]
    confirmed_on = [Path(c).stem for c in args.confirm.split(",") if c]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}, torch {torch.__version__}, "
          f"load avg {os.getloadavg()[0]:.1f}", flush=True)
    recorded = json.loads(OUT.read_text())["recorded"] if OUT.exists() else {}
    if not args.replay_only:
        for cfg in args.choose.split(",") + args.confirm.split(","):
            if cfg:
                got, had = record(cfg, args), recorded.get(Path(cfg).stem)
                if had and (had["epochs"], had["evals_per_epoch"]) == (got["epochs"], got["evals_per_epoch"]):
                    # seeds recorded by an earlier call stay (a slow set can be recorded a seed per call)
                    fresh = {r["seed"] for r in got["runs"]}
                    got["runs"] = sorted([r for r in had["runs"] if r["seed"] not in fresh] + got["runs"], key=lambda r: r["seed"])
                recorded[Path(cfg).stem] = got
                OUT.parent.mkdir(parents=True, exist_ok=True)
                OUT.write_text(json.dumps({"recorded": recorded}, indent=1))
    baseline = (1, 2, None)
    scored_choose = score(recorded, chosen_on, baseline)
    print_table(f"chosen on {', '.join(chosen_on)}", scored_choose, chosen_on)
    pick = choose(scored_choose, args.tolerance)
    print(f"\nchosen (cheapest with worst dNE <= {args.tolerance}): {pick}")
    scored_confirm = score(recorded, confirmed_on, baseline) if confirmed_on else {}
    if confirmed_on:
        print_table(f"confirmed on {', '.join(confirmed_on)}", scored_confirm, confirmed_on)
        print_table("the chosen rule on the confirming datasets", scored_confirm, confirmed_on, [pick])
    OUT.write_text(json.dumps({"recorded": recorded, "chosen_on": chosen_on, "confirmed_on": confirmed_on, "pick": pick,
                               "choose": scored_choose, "confirm": scored_confirm}, indent=1))
    print(f"figures written to {OUT}")


if __name__ == "__main__":
    main()
