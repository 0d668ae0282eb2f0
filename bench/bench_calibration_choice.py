"""Calibration chosen per cell vs always applied (issue 38): on trained models, how many (model,
cell) pairs end with a test calibration further from 1 than before the step (beyond noise), and
the macro test NE, for three rules:

  always      every cell's map applied (training.calibration_choice: always, the old step)
  crossfit    a map kept where, fitted on one half of the cell's validation rows and judged on the
              other (both ways), it improves validation NE beyond the paired bootstrap's 95%
              interval (training.calibration_choice: validated, the default)
  insample    the same rule judged on the rows the map was fitted on (the dishonest variant)

    nice .venv/bin/python bench/bench_calibration_choice.py WORKDIR [WORKDIR ...] [--models teacher,student]

Each WORKDIR holds training_set/ and models/<name>/model.pt (a demo or `lattice train` work
dir). Every model is scored once without its calibration stage on the validation and test
splits; the maps are refitted from those logits with the model's own method, so the figures do
not depend on which rule the model was trained under. Honesty of a judge: for every cell, its
estimate of the map's validation NE change against the map's real test NE change (mean over
cells, and how many cells it approves whose test NE got worse beyond noise). Figures go to
`--out` (JSON). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from calibration_methods import raw_scores  # noqa: E402

from lattice.config import PlatformConfig  # noqa: E402
from lattice.evaluation.compare import paired_bootstrap  # noqa: E402
from lattice.models.calibrated import CellCalibration  # noqa: E402
from lattice.models.saved import read_blob  # noqa: E402
from lattice.training import calibration as C  # noqa: E402

RULES = {"always": ("always", "crossfit"), "crossfit": ("validated", "crossfit"), "insample": ("validated", "insample")}


def _config(blob: dict) -> PlatformConfig:
    # models saved by earlier versions carry sections whose keys have since changed (see
    # bench/calibration_methods.py); neither changes the network
    blob["config"].pop("hashing", None)
    if not (blob["config"].get("fp8") or {}).get("enabled"):
        blob["config"].pop("fp8", None)
    return PlatformConfig.model_validate(blob["config"])


def _frame(config: PlatformConfig, test, probs: dict) -> object:
    base = test[["example_id", "domain"] + [f"{k}_{o}" for o in config.objective_names for k in ("label", "mask")]]
    return base.assign(**{f"p_{o}": probs[o] for o in config.objective_names})


def bench_model(model_dir: Path, table: Path, cache: Path | None = None) -> dict:
    blob, _ = read_blob(model_dir)
    config = _config(blob)
    method = config.training.calibration if config.training.calibration != "none" else "platt"
    floor = config.training.calibration_min_positives
    frames = []
    for split in ("validation", "test"):
        kept = cache / f"{model_dir.parent.parent.name}_{model_dir.name}_{split}.parquet" if cache else None
        if kept is not None and kept.exists():
            frames.append(pd.read_parquet(kept))
            continue
        frames.append(raw_scores(config, blob, table, split))
        if kept is not None:
            kept.parent.mkdir(parents=True, exist_ok=True)
            frames[-1].to_parquet(kept, index=False)
    val, test = frames
    raw = C.calibrated_probabilities(config, test, None)
    out: dict = {"method": method, "validation_rows": len(val), "test_rows": len(test), "rules": {}}
    for rule, (choice, judge) in RULES.items():
        maps = C.fit_maps(config, val, method, floor, choice=choice, judge=judge)
        cal = C.calibrated_probabilities(config, test, CellCalibration(maps))
        eff = C.effect(config, test, raw, cal)
        test_gap = paired_bootstrap(config, _frame(config, test, raw), _frame(config, test, cal))["cells"]
        cells = {}
        for cell, e in eff.items():
            m = maps["cells"][cell]
            cells[cell] = {"kept": (m.get("choice") or {}).get("kept", True), "fit": m["method"],
                           "val_positives": m["positives"], "test_positives": e["positives"],
                           "calibration_before": e["shift"]["before"], "calibration_after": e["shift"]["after"],
                           "moved_away": e["shift"]["moved_away"], "distance_change": e["shift"]["distance_change"],
                           "moved_away_point": bool(e["shift"]["distance_change"] > 0),
                           "test_ne_before": e["before"]["ne"], "test_ne_after": e["after"]["ne"],
                           "test_ne_worse": bool(test_gap[cell]["low"] > 0),
                           "val_estimate": (m.get("choice") or {}).get("ne_diff")}
        out["rules"][rule] = cells
    # honesty of each judge on the same candidate maps (those `always` applies)
    always = C.fit_maps(config, val, method, floor, choice="always")
    for judge in ("crossfit", "insample"):
        decision = C.choose(config, val, always, method, floor, judge=judge)
        real = {c: v["test_ne_after"] - v["test_ne_before"] for c, v in out["rules"]["always"].items()}
        est = {c: d["ne_diff"] for c, d in decision.items()}
        ok = [c for c in real if np.isfinite(real[c]) and np.isfinite(est[c])]
        approved_worse = [c for c in ok if decision[c]["kept"] and out["rules"]["always"][c]["test_ne_worse"]]
        out[f"judge_{judge}"] = {"mean_estimate": float(np.mean([est[c] for c in ok])) if ok else None,
                                 "mean_test_change": float(np.mean([real[c] for c in ok])) if ok else None,
                                 "approved": sum(decision[c]["kept"] for c in ok), "approved_test_worse": approved_worse}
    return out


def _print(name: str, res: dict) -> None:
    print(f"\n== {name} ({res['method']}): {res['validation_rows']:,} validation rows, {res['test_rows']:,} test rows")
    print(f"{'cell':20s} {'val+':>5s} {'test+':>5s}  raw calib  " + "  ".join(f"{r:>24s}" for r in RULES)
          + "   (calibration after; ! further from 1 beyond noise)")
    first = res["rules"]["always"]
    for cell in first:
        row = [f"{cell:20s} {first[cell]['val_positives']:5d} {first[cell]['test_positives']:5d}  "
               f"{first[cell]['calibration_before']:9.3f}  "]
        for r in RULES:
            c = res["rules"][r][cell]
            row.append(f"{'kept' if c['kept'] else 'drop':>4s} {c['calibration_after']:.3f}{'!' if c['moved_away'] else ' '} "
                       f"NE {c['test_ne_after']:.4f}")
        print("  ".join(row))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workdirs", nargs="+")
    p.add_argument("--models", default="teacher,student,separate,pooled,mmoe")
    p.add_argument("--out", default=str(ROOT / ".lattice" / "bench" / "calibration_choice.json"))
    p.add_argument("--cache", default=None, help="folder keeping each model's raw validation / test logits between runs")
    args = p.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, load avg {os.getloadavg()[0]:.1f}", flush=True)
    out: dict = {}
    for wd in args.workdirs:
        wd = Path(wd)
        t = time.perf_counter()
        found = {m: wd / "models" / m for m in args.models.split(",") if (wd / "models" / m / "model.pt").exists()}
        res = {m: bench_model(d, wd / "training_set", Path(args.cache) if args.cache else None) for m, d in found.items()}
        for m, r in res.items():
            _print(f"{wd.name}/{m}", r)
        summary = {}
        for rule in RULES:
            cells = [c for r in res.values() for c in r["rules"][rule].values()]
            fin = [c for c in cells if np.isfinite(c["test_ne_after"])]
            summary[rule] = {"pairs": len(cells), "kept": sum(c["kept"] for c in cells),
                             "moved_away": sum(c["moved_away"] for c in cells),
                             "moved_away_point": sum(c["moved_away_point"] for c in cells),
                             "test_ne_worse": sum(c["test_ne_worse"] for c in cells),
                             "macro_test_ne_raw": float(np.mean([c["test_ne_before"] for c in fin])),
                             "macro_test_ne": float(np.mean([c["test_ne_after"] for c in fin]))}
        judges = {j: {k: sum(r[f"judge_{j}"][k] for r in res.values()) if k == "approved" else
                      sum(len(r[f"judge_{j}"][k]) for r in res.values()) if k == "approved_test_worse" else
                      float(np.mean([r[f"judge_{j}"][k] for r in res.values() if r[f"judge_{j}"][k] is not None]))
                      for k in ("mean_estimate", "mean_test_change", "approved", "approved_test_worse")}
                  for j in ("crossfit", "insample")}
        print(f"\n== {wd.name}: {len(res)} models ({', '.join(res)}), {time.perf_counter() - t:.0f}s")
        print(f"{'rule':>9s}  pairs  kept  calibration further from 1: at all / beyond noise  test NE worse beyond noise  "
              "macro test NE raw -> after")
        for rule, s in summary.items():
            print(f"{rule:>9s}  {s['pairs']:5d}  {s['kept']:4d}  {s['moved_away_point']:34d} / {s['moved_away']:<13d}  "
                  f"{s['test_ne_worse']:26d}  {s['macro_test_ne_raw']:.4f} -> {s['macro_test_ne']:.4f}")
        for j, v in judges.items():
            print(f"judge {j:>9s}: mean validation NE change it estimates {v['mean_estimate']:+.4f}, mean real test change "
                  f"{v['mean_test_change']:+.4f}; approves {v['approved']} maps, "
                  f"{v['approved_test_worse']} of them worse on test")
        out[wd.name] = {"models": res, "summary": summary, "judges": judges}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=float))
    print(f"\nfigures: {args.out}")


if __name__ == "__main__":
    main()
