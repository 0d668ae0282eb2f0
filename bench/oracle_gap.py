"""Where a model's distance to the oracle comes from, on the synthetic demo data (click).

The generator's true click probability combines structure (segment and category centres, the
domain mixing, position, device, query match, activity) with per-id effects (each user's and ad's
own latent offset and bias). This recomputes the truth for the test rows with parts withheld, each
variant rescaled per domain to the truth's mean so only the missing information counts, and prints
every variant's log loss over the oracle's next to the model's: overall and by how many training
rows the user / the ad has. "structure only" is what a model would reach that learned the
structure perfectly and nothing about individual ids.

    .venv/bin/python bench/oracle_gap.py --predictions WORK/models/teacher/predictions.parquet \\
        --training-set WORK/training_set --rows 1000000

`--rows` is the size the log was generated with (it sets the id space); the config's `synthetic`
block must be the one that generated it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import expit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lattice.config import load_config
from lattice.config.schema import Synthetic
from lattice.data import synth as S
from lattice.data.split import split_mask

COLUMNS = ["example_id", "split", "user_id", "ad_id", "user_segment", "ad_category", "device", "position", "query_category", "activity"]
BINS = [(0, 0), (1, 4), (5, 19), (20, 99), (100, 499), (500, None)]


def log_loss(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return -(y * np.log(p) + (1 - y) * np.log(1 - p))


def variants(world: S.World, d: pd.DataFrame) -> dict[str, np.ndarray]:
    """Click probabilities of the truth with parts withheld, for the rows of `d`."""
    dom = d.domain.map({n: i for i, n in enumerate(S.DOMAINS)}).to_numpy()
    u, a = d.user_id.to_numpy() - 1, d.ad_id.to_numpy() - 1
    seg_vec, cat_vec = world.segment_centers[world.user_segment[u]], world.category_centers[world.ad_category[a]]
    rest = {"pos": d.position.fillna(0).astype(int).to_numpy(), "dev": d.device.fillna(0).astype(int).to_numpy(),
            "query_match": (d.query_category == d.ad_category).to_numpy(), "activity": d.activity.to_numpy()}

    def p(uv, av, ub, ab) -> np.ndarray:
        return expit(S.click_logit(world, dom, uv, av, ub, ab, **rest))

    out = {
        "oracle (recomputed)": p(world.user_vec[u], world.ad_vec[a], world.user_bias[u], world.ad_bias[a]),
        "no user effects": p(seg_vec, world.ad_vec[a], 0.0, world.ad_bias[a]),
        "no ad effects": p(world.user_vec[u], cat_vec, world.user_bias[u], 0.0),
        "structure only": p(seg_vec, cat_vec, 0.0, 0.0),
    }
    truth = d.truth_click.to_numpy()
    for v in out.values():  # per-domain rescaling to the truth's mean: missing information, not bias
        for k in range(len(S.DOMAINS)):
            s = dom == k
            if s.any():
                v[s] = np.clip(v[s] * truth[s].sum() / v[s].sum(), 0.0, 1.0)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--predictions", required=True, help="a model's predictions.parquet (test split)")
    p.add_argument("--training-set", required=True, help="the training set the model was trained on")
    p.add_argument("--rows", type=int, required=True, help="rows the synthetic log was generated with")
    p.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    args = p.parse_args()
    config = load_config(args.config)
    params = config.synthetic or Synthetic()
    world = S.World.draw(params, *S.id_space(params, args.rows))

    pred = pd.read_parquet(args.predictions)
    pred = pred[pred.mask_click == 1]
    table = pd.read_parquet(args.training_set, columns=COLUMNS)
    train = table[split_mask(config, table.example_id, "train", table["split"])]
    d = pred.merge(table, on="example_id", how="inner")
    if len(d) != len(pred):
        sys.exit(f"{len(pred) - len(d)} predicted rows are not in {args.training_set}: pass the training set the model used")
    y = d.label_click.to_numpy()
    oracle = log_loss(d.truth_click.to_numpy(), y)
    rows = {"model": log_loss(d.p_click.to_numpy(), y)}
    vs = variants(world, d)
    drift = float(np.abs(vs.pop("oracle (recomputed)") - d.truth_click.to_numpy()).max())
    if drift > 1e-3:  # the wrong --rows or synthetic block draws another world
        sys.exit(f"the recomputed truth differs from the logged one by {drift:.3g}: check --rows and the config's synthetic block")
    rows.update({k: log_loss(v, y) for k, v in vs.items()})

    print(f"{len(d):,} test rows with a click label; log loss / oracle log loss - 1:")
    for k, v in rows.items():
        print(f"  {k:34s} {v.mean() / oracle.mean() - 1:+7.2%}")
    for key, name in (("user_id", "user"), ("ad_id", "ad")):
        n = d[key].map(train[key].value_counts()).fillna(0).to_numpy()
        print(f"\nby training rows per {name}: share of test rows, then each row's gap")
        print(f"  {'rows':>9s} {'share':>6s} " + " ".join(f"{k:>16s}" for k in rows))
        for lo, hi in BINS:
            s = (n >= lo) & (n <= (hi if hi is not None else np.inf))
            if s.any():
                label = f"{lo}+" if hi is None else f"{lo}-{hi}"
                print(f"  {label:>9s} {s.mean():6.1%} " + " ".join(f"{v[s].mean() / oracle[s].mean() - 1:+16.1%}" for v in rows.values()))


if __name__ == "__main__":
    main()
