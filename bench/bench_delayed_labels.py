"""Delayed conversions: what a model trained at a cutoff learns under each label rule.

A simulated market (bench/configs/demo_market.yaml, made stationary: no drift, no shock, so the
label rule is the only thing that differs) logs 30% of its conversions 1-7 days after the
impression. At the cutoff T (the end of day 13 of 21) a conversion model (scikit-learn logistic
regression on one-hot categorical features and the dense features) is trained on every impression
before T, with the labels as known at T under each rule:

  naive              every conversion not yet logged is a negative (the rule before this change)
  mask               impressions whose 7-day window is still open at T are left out (the platform's rule)
  mask_keep_seen     as mask, but a conversion already logged inside an open window is kept as a
                     positive (its not-yet-converted neighbours stay out): shown to say why `mask`
                     drops them too
  zipper             the data of Zipper heads (lattice.data.zipper; windows 1d / 3d / 7d with
                     shares 0.3 / 0.3 / 0.4): each impression hashed to one window and labelled
                     with what was logged within it once that window closed. The model is the
                     linear analogue of K heads on a shared body: shared feature weights plus one
                     intercept per head; it predicts with the 7-day head
  matured            the final labels (not available at T: the ceiling)

Each model is judged on the first day after T, with the labels matured (the log runs 8 days past
T, longer than the window): calibration = sum(predicted) / sum(matured labels), also against the
sum of the true probabilities (noise-free), NE and AUC, for feed and search together and apart.

    .venv/bin/python bench/bench_delayed_labels.py [--rows-per-day 30000] [--seeds 1 2 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lattice.config import load_config  # noqa: E402
from lattice.config.timing import Market  # noqa: E402
from lattice.data import schema as S  # noqa: E402
from lattice.data.label_time import _cutoff_us, _to_us, mask_at_cutoff  # noqa: E402
from lattice.data.local_consolidate import consolidate  # noqa: E402
from lattice.data.zipper import head_labels  # noqa: E402
from lattice.paths import Paths  # noqa: E402

DAYS, CUTOFF_DAY = 21, 13
CATEGORICAL = ["domain", "user_segment", "ad_category", "device", "position", "query_category", "query_match"]
RULES = ("naive", "mask", "mask_keep_seen", "zipper", "matured")
ZIPPER_WINDOWS = [dt.timedelta(days=1), dt.timedelta(days=3), dt.timedelta(days=7)]
ZIPPER_SHARES = [0.3, 0.3, 0.4]


def market_config(seed: int, rows_per_day: int):
    cfg = load_config(ROOT / "bench" / "configs" / "demo_market.yaml")
    m = cfg.synthetic.market.model_copy(update={"ctr_drift": 0.0, "shock": None})
    m = Market.model_validate(m.model_dump())
    syn = cfg.synthetic.model_copy(update={"seed": seed, "days": DAYS, "rows": rows_per_day * DAYS,
                                           "chunk_rows": max(1000, rows_per_day), "market": m})
    return cfg.model_copy(update={"synthetic": syn})


def labels_under(rule: str, df: pd.DataFrame, cutoff: dt.datetime, config) -> tuple[np.ndarray, np.ndarray]:
    o = "conversion"
    lab, msk = S.label_column(o), S.mask_column(o)
    if rule == "matured":
        return df[lab].to_numpy(), df[msk].to_numpy()
    if rule in ("naive", "mask"):
        out = mask_at_cutoff(df, cutoff, config, rule)
        return out[lab].to_numpy(), out[msk].to_numpy()
    # mask_keep_seen: the naive rule's seen positives, plus mask's closed windows
    naive = mask_at_cutoff(df, cutoff, config, "naive")
    masked = mask_at_cutoff(df, cutoff, config, "mask")
    seen = naive[lab].to_numpy() == 1
    return np.where(seen, 1, masked[lab].to_numpy()), np.where(seen, df[msk].to_numpy(), masked[msk].to_numpy())


def features(df: pd.DataFrame):
    from scipy import sparse

    cats = [df[c].astype("string").fillna("na").to_numpy() for c in CATEGORICAL]
    # domain x category: the conversion rate's domain-specific part
    cats.append((df["domain"].astype(str) + ":" + df["ad_category"].astype("string").fillna("na")).to_numpy())
    dense = np.column_stack([np.log1p(df["price"].to_numpy()), df["activity"].to_numpy(),
                             np.log1p(df["activity"].to_numpy())])
    return cats, dense, sparse


def encoder(train_cats, train_dense):
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    oh = OneHotEncoder(handle_unknown="ignore", min_frequency=20).fit(np.column_stack(train_cats))
    sc = StandardScaler().fit(train_dense)
    return oh, sc


def transform(oh, sc, cats, dense, sparse):
    return sparse.hstack([oh.transform(np.column_stack(cats)), sparse.csr_matrix(sc.transform(dense))]).tocsr()


def ne(y: np.ndarray, p: np.ndarray) -> float:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    ll = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    r = y.mean()
    return float(ll / -(r * np.log(r) + (1 - r) * np.log(1 - r)))


def run_seed(seed: int, rows_per_day: int) -> list[dict]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    from lattice.data.synth import generate

    config = market_config(seed, rows_per_day)
    timings = {}
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        generate(config, config.synthetic.rows, tmp, progress=False)
        timings["synth"] = time.perf_counter() - t
        t = time.perf_counter()
        df = consolidate(config, Paths(Path(tmp) / "wd", Path(tmp)))
        timings["consolidate"] = time.perf_counter() - t
    df = df[df.domain.isin(["feed", "search"])].reset_index(drop=True)  # the domains that carry conversions
    start = dt.datetime.combine(config.time_range.start, dt.time())
    cutoff = start + dt.timedelta(days=CUTOFF_DAY)
    ts = _to_us(df["event_timestamp"])
    train = df[ts < _cutoff_us(cutoff)].reset_index(drop=True)
    test = df[(ts >= _cutoff_us(cutoff)) & (ts < _cutoff_us(cutoff + dt.timedelta(days=1)))].reset_index(drop=True)
    cats, dense, sparse = features(train)
    oh, sc = encoder(cats, dense)
    x_train = transform(oh, sc, cats, dense, sparse)
    x_test = transform(oh, sc, *features(test))
    y_test = test[S.label_column("conversion")].to_numpy()
    truth = test[S.truth_column("conversion")].to_numpy()
    out = []
    for rule in RULES:
        t = time.perf_counter()
        if rule == "zipper":
            heads = head_labels(train, "conversion", cutoff, ZIPPER_WINDOWS, ZIPPER_SHARES)
            y = sum(lab.astype(np.int64) for lab, _ in heads.values())  # each row is in one head at most
            head = sum(j * msk.astype(np.int64) for j, (_, msk) in heads.items())
            keep = sum(msk.astype(np.int64) for _, msk in heads.values()) == 1
            onehot = sparse.csr_matrix(np.eye(len(ZIPPER_WINDOWS))[head])
            model = LogisticRegression(C=1.0, max_iter=500, fit_intercept=False).fit(
                sparse.hstack([x_train, onehot]).tocsr()[keep], y[keep])
            last = sparse.csr_matrix(np.tile(np.eye(len(ZIPPER_WINDOWS))[-1], (x_test.shape[0], 1)))
            p = model.predict_proba(sparse.hstack([x_test, last]).tocsr())[:, 1]
        else:
            y, m = labels_under(rule, train, cutoff, config)
            keep = m == 1
            model = LogisticRegression(C=1.0, max_iter=500).fit(x_train[keep], y[keep])
            p = model.predict_proba(x_test)[:, 1]
        row = {"seed": seed, "rule": rule, "train_rows": int(keep.sum()), "train_rate": float(y[keep].mean()),
               "fit_s": round(time.perf_counter() - t, 1)}
        for name, sel in (("all", np.ones(len(test), bool)), ("feed", (test.domain == "feed").to_numpy()),
                          ("search", (test.domain == "search").to_numpy())):
            row[f"calib_{name}"] = float(p[sel].sum() / y_test[sel].sum())
            row[f"calib_truth_{name}"] = float(p[sel].sum() / truth[sel].sum())
        row["ne"] = ne(y_test, p)
        row["auc"] = float(roc_auc_score(y_test, p))
        out.append(row)
    out[0]["test_rows"], out[0]["test_conversions"] = len(test), int(y_test.sum())
    out[0]["timings"] = {k: round(v, 1) for k, v in timings.items()}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows-per-day", type=int, default=30_000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = ap.parse_args()
    print(f"machine: {platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}; "
          f"{DAYS} days x {args.rows_per_day} impressions, cutoff after day {CUTOFF_DAY}, judged on day {CUTOFF_DAY + 1} "
          "with matured labels; 30% of conversions 1-7 days late, attribution 7d")
    rows = []
    for seed in args.seeds:
        got = run_seed(seed, args.rows_per_day)
        print(f"seed {seed}: test day {got[0]['test_rows']} rows, {got[0]['test_conversions']} matured conversions; "
              f"timings {got[0]['timings']}", flush=True)
        rows += got
    res = pd.DataFrame(rows)
    cols = ["train_rows", "train_rate", "calib_all", "calib_truth_all", "calib_feed", "calib_search", "ne", "auc"]
    pd.set_option("display.width", 200)
    print("\nper seed:")
    print(res[["seed", "rule", *cols, "fit_s"]].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print("\nmean over seeds (calibration = sum(pred) / sum(matured labels); calib_truth: / sum(true p)):")
    mean = res.groupby("rule", sort=False)[cols].mean()
    print(mean.to_string(float_format=lambda v: f"{v:.4f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
