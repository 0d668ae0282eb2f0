"""Which calibration map (training.calibration) to use: every method fitted on the validation
split of trained models, measured per (domain, objective) cell on the test split.

    .venv/bin/python bench/calibration_methods.py --table WORKDIR/training_set WORKDIR/models/teacher [MODEL_DIR ...]

Each model is scored once without its calibration stage (the raw network of model.pt) on the
validation and test splits of `--table` (the table it was trained on); then each method is fitted
on the validation logits and applied to the test logits through the module the artifact runs.
Prints per cell: test positives, calibration (sum p / sum y), ECE and NE before and after, and per
method the macro ECE / NE and the cells with at least `--goal-positives` test positives whose
calibration lands outside [0.95, 1.05]. Figures go to `--out` (JSON). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lattice.config import PlatformConfig  # noqa: E402
from lattice.data.loader import BatchLoader  # noqa: E402
from lattice.data.transforms import DenseStats  # noqa: E402
from lattice.models.calibrated import CellCalibration  # noqa: E402
from lattice.models.saved import read_blob, rebuild  # noqa: E402
from lattice.training import calibration as C  # noqa: E402


@torch.no_grad()
def raw_scores(config: PlatformConfig, blob: dict, table: Path, split: str) -> pd.DataFrame:
    net = rebuild(blob, calibrated=False)
    stats = DenseStats.from_json(blob["dense_stats"])
    frames = []
    for b in BatchLoader(config, table, stats, split, shuffle=False, batch_size=8192, num_workers=0):
        logits = net(b.dense, b.sparse, b.domain)
        f = {"example_id": b.example_ids, "domain": np.array(config.domain_names)[b.domain.numpy()]}
        for o in config.objective_names:
            f[f"z_{o}"], f[f"label_{o}"], f[f"mask_{o}"] = logits[o].numpy(), b.labels[o].numpy(), b.masks[o].numpy()
        frames.append(pd.DataFrame(f))
    return pd.concat(frames, ignore_index=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", help="model folders holding model.pt")
    p.add_argument("--table", required=True, help="the example table the models were trained on")
    p.add_argument("--methods", default="platt,isotonic,histogram")
    p.add_argument("--min-positives", default="0,200", help="fallback-to-Platt thresholds to try (comma list)")
    p.add_argument("--goal-positives", type=int, default=200)
    p.add_argument("--out", default=str(ROOT / ".lattice" / "bench" / "calibration_methods.json"))
    args = p.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, load avg {os.getloadavg()[0]:.1f}", flush=True)
    out: dict = {}
    for model_dir in args.models:
        blob, _ = read_blob(Path(model_dir))
        # models saved by earlier versions carry sections whose keys have since changed: a
        # top-level `hashing` (each sparse feature names its scheme now) and a disabled `fp8`;
        # neither changes the network, so they go
        blob["config"].pop("hashing", None)
        if not (blob["config"].get("fp8") or {}).get("enabled"):
            blob["config"].pop("fp8", None)
        config = PlatformConfig.model_validate(blob["config"])
        val, test = (raw_scores(config, blob, Path(args.table), s) for s in ("validation", "test"))
        raw = C.calibrated_probabilities(config, test, None)
        name = f"{Path(model_dir).parent.parent.name}/{Path(model_dir).name}"
        res: dict = {}
        for method in args.methods.split(","):
            for floor in [int(x) for x in args.min_positives.split(",")]:
                if method == "platt" and floor != 0:
                    continue
                maps = C.fit_maps(config, val, method, floor, choice="always")  # every map: this bench compares methods
                cal = C.calibrated_probabilities(config, test, CellCalibration(maps))
                cells = C.effect(config, test, raw, cal)
                for cell, m in maps["cells"].items():
                    cells[cell]["fit"], cells[cell]["val_positives"] = m["method"], m["positives"]
                res[f"{method}@{floor}"] = cells
        out[name] = res
        print(f"\n== {name}: {len(val):,} validation rows, {len(test):,} test rows")
        print(f"{'cell':22s} {'val+':>5s} {'test+':>5s} {'method':>13s} {'fit':>9s}  calib bef->aft    ECE bef->aft        NE bef->aft      AUC bef->aft")
        for key, cells in res.items():
            for cell, c in cells.items():
                b, a = c["before"], c["after"]
                print(f"{cell:22s} {c['val_positives']:5d} {c['positives']:5d} {key:>13s} {c['fit']:>9s}  "
                      f"{b['calibration']:.3f}->{a['calibration']:.3f}  {b['ece']:.5f}->{a['ece']:.5f}  "
                      f"{b['ne']:.4f}->{a['ne']:.4f}  {b['auc']:.4f}->{a['auc']:.4f}")
        print(f"{'method':>13s}  macro ECE after  macro NE after  cells >= {args.goal_positives} test positives outside [0.95, 1.05]")
        for key, cells in res.items():
            ece = np.nanmean([c["after"]["ece"] for c in cells.values()])
            nes = np.nanmean([c["after"]["ne"] for c in cells.values()])
            off = [f"{k}={c['after']['calibration']:.3f}" for k, c in cells.items()
                   if c["positives"] >= args.goal_positives and not 0.95 <= c["after"]["calibration"] <= 1.05]
            print(f"{key:>13s}  {ece:.5f}          {nes:.4f}          {', '.join(off) or 'none'}")
        first = next(iter(res.values()))
        print(f"{'(raw)':>13s}  {np.nanmean([c['before']['ece'] for c in first.values()]):.5f}          "
              f"{np.nanmean([c['before']['ne'] for c in first.values()]):.4f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=float))
    print(f"\nfigures: {args.out}")


if __name__ == "__main__":
    main()
