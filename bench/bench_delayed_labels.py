"""Delayed conversions: what a model trained at a cutoff learns under each label rule.

A simulated market (bench/configs/demo_market.yaml, made stationary: no drift, no shock, so the
label rule is the only thing that differs) logs 30% of its conversions 1-7 days after the
impression. At the cutoff T (the end of day 13 of 21) conversion models are trained with the
labels as known at T, and judged on the first day after T with its labels matured (the log runs 8
days past T, longer than the 7-day attribution window): calibration = sum(predicted) / sum(matured
labels), also against the sum of the true probabilities (noise-free), NE and AUC, on the
conversion domains (feed and search) together and apart.

Two families of models:

The platform's teacher (`net:` rows), trained by the same stage function `lattice train` runs
(lattice.training.stages.train) as a windowed run (`training.window: 13d` ending at T: train on
days 1-12, validate on day 13, test on day 14; the loader reads train and validation labels as
known at T), 1 process, the post-hoc calibration stage off so the network itself is judged:

  naive              every conversion not yet logged is a negative (`training.label_delay: naive`)
  mask               impressions whose 7-day window is still open at T are left out (`mask`, the default)
  zipper             Zipper heads (`label_delay: zipper`, windows 1d / 3d / 7d, shares 0.3 / 0.3 / 0.4):
                     the teacher grows a 1-day and a 3-day conversion head beside its own (7-day) one;
                     each impression trains the head of its hashed window once that window closed;
                     the 7-day head is the prediction (what export and serving use)
  matured            the final labels (not available at T: the ceiling; conversion read without its
                     attribution window)

A logistic regression (`lr:` rows; scikit-learn on one-hot categorical features and the dense
features, conversion domains only, every impression before T) under naive, mask, mask_keep_seen
(as mask, but a conversion already logged inside an open window is kept as a positive: shown to
say why `mask` drops them too) and matured. `--no-linear` skips it.

    nice .venv/bin/python bench/bench_delayed_labels.py [--rows-per-day 25000] [--seeds 1 2 3] [--net-epochs 1]
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
from lattice.paths import Paths  # noqa: E402

DAYS, CUTOFF_DAY = 21, 13
CATEGORICAL = ["domain", "user_segment", "ad_category", "device", "position", "query_category", "query_match"]
RULES = ("naive", "mask", "mask_keep_seen", "matured")
NET_RULES = ("naive", "mask", "zipper", "matured")
ZIPPER = {"windows": ["1d", "3d", "7d"], "shares": [0.3, 0.3, 0.4]}


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


def judge(domain: np.ndarray, y: np.ndarray, truth: np.ndarray, p: np.ndarray) -> dict:
    """Conversion calibration (against matured labels and against the truth), NE and AUC on the
    test day's conversion domains."""
    from sklearn.metrics import roc_auc_score

    row = {}
    for name, sel in (("all", np.isin(domain, ["feed", "search"])), ("feed", domain == "feed"), ("search", domain == "search")):
        row[f"calib_{name}"] = float(p[sel].sum() / y[sel].sum())
        row[f"calib_truth_{name}"] = float(p[sel].sum() / truth[sel].sum())
    sel = np.isin(domain, ["feed", "search"])
    row["ne"] = ne(y[sel], p[sel])
    row["auc"] = float(roc_auc_score(y[sel], p[sel]))
    return row


def net_config(config, rule: str, data_root: str, epochs: int):
    """The market config for one teacher run under `rule`, as `lattice train` would load it."""
    from lattice.config.schema import PlatformConfig

    data = config.model_dump(mode="json")
    data["data_root"] = data_root
    data["training"].update({"window": f"{CUTOFF_DAY}d", "epochs": epochs, "calibration": "none", "nproc": 1,
                             "label_delay": "mask" if rule == "matured" else rule,
                             "zipper": dict(ZIPPER) if rule == "zipper" else None})
    if rule == "matured":  # conversion read as it finally is: no window, so no cutoff applies
        data["objectives"] = [{**o, "attribution": None} for o in data["objectives"]]
        for src in data["sources"]:
            for spec in src.get("labels", {}).values():
                spec["known_at"] = None
    return PlatformConfig.model_validate(data)


def run_nets(config, df: pd.DataFrame, tmp: Path, seed: int, epochs: int, rules=NET_RULES) -> list[dict]:
    """The platform teacher under each label rule: `lattice train`'s stage function, windowed."""
    import contextlib

    from lattice.data.local_table import write_local_table
    from lattice.training.stages import train
    from lattice.trees.fit import fit_trees_if_on

    paths = Paths(tmp / "work", tmp / "raw")
    write_local_table(config, paths, df=df)
    end = (config.time_range.start + dt.timedelta(days=CUTOFF_DAY)).isoformat()  # test day = day CUTOFF_DAY + 1
    out = []
    for rule in rules:
        cfg = net_config(config, rule, str(tmp / "raw"), epochs)
        t = time.perf_counter()
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):  # the trainer's plan and notes
            fit_trees_if_on(cfg, paths, end=end)  # the leaf features' trees of this window (models.leaves)
            s = train(cfg, paths, f"teacher@{rule}", nproc=1, end=end, seed=seed, progress=False)
        pred = pd.read_parquet(paths.model_dir(f"teacher@{rule}") / "predictions.parquet")
        pred = pred[pred[S.mask_column("conversion")] == 1]
        row = {"seed": seed, "rule": f"net:{rule}", "train_examples": int(sum(e["examples"] for e in s["history"])),
               "fit_s": round(time.perf_counter() - t, 1)}
        row.update(judge(pred.domain.to_numpy(), pred[S.label_column("conversion")].to_numpy(),
                         pred[S.truth_column("conversion")].to_numpy(), pred["p_conversion"].to_numpy()))
        out.append(row)
    return out


def run_seed(seed: int, rows_per_day: int, linear: bool, net_epochs: int, net_rules=NET_RULES) -> list[dict]:
    from sklearn.linear_model import LogisticRegression

    from lattice.data.synth import generate

    config = market_config(seed, rows_per_day)
    timings = {}
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t = time.perf_counter()
        generate(config, config.synthetic.rows, tmp / "raw", progress=False)
        timings["synth"] = time.perf_counter() - t
        t = time.perf_counter()
        full = consolidate(config, Paths(tmp / "wd", tmp / "raw"))
        timings["consolidate"] = time.perf_counter() - t
        if net_epochs:
            t = time.perf_counter()
            out += run_nets(config, full, tmp, seed, net_epochs, net_rules)
            timings["nets"] = time.perf_counter() - t
    df = full[full.domain.isin(["feed", "search"])].reset_index(drop=True)  # the domains that carry conversions
    start = dt.datetime.combine(config.time_range.start, dt.time())
    cutoff = start + dt.timedelta(days=CUTOFF_DAY)
    ts = _to_us(df["event_timestamp"])
    test = df[(ts >= _cutoff_us(cutoff)) & (ts < _cutoff_us(cutoff + dt.timedelta(days=1)))].reset_index(drop=True)
    y_test = test[S.label_column("conversion")].to_numpy()
    truth = test[S.truth_column("conversion")].to_numpy()
    if linear:
        train = df[ts < _cutoff_us(cutoff)].reset_index(drop=True)
        cats, dense, sparse = features(train)
        oh, sc = encoder(cats, dense)
        x_train = transform(oh, sc, cats, dense, sparse)
        x_test = transform(oh, sc, *features(test))
        for rule in RULES:
            t = time.perf_counter()
            y, m = labels_under(rule, train, cutoff, config)
            keep = m == 1
            model = LogisticRegression(C=1.0, max_iter=500).fit(x_train[keep], y[keep])
            p = model.predict_proba(x_test)[:, 1]
            row = {"seed": seed, "rule": f"lr:{rule}", "train_examples": int(keep.sum()),
                   "fit_s": round(time.perf_counter() - t, 1)}
            row.update(judge(test.domain.to_numpy(), y_test, truth, p))
            out.append(row)
    out[0]["test_rows"], out[0]["test_conversions"] = len(test), int(y_test.sum())
    out[0]["timings"] = {k: round(v, 1) for k, v in timings.items()}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows-per-day", type=int, default=30_000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--net-epochs", type=int, default=1, help="teacher epochs (0: skip the platform teacher)")
    ap.add_argument("--no-linear", action="store_true", help="skip the logistic-regression models")
    ap.add_argument("--net-rules", nargs="+", default=list(NET_RULES), choices=NET_RULES, help="teacher runs to make")
    ap.add_argument("--zipper-shares", type=float, nargs=3, default=ZIPPER["shares"], help="shares of the 1d / 3d / 7d windows")
    args = ap.parse_args()
    ZIPPER["shares"] = list(args.zipper_shares)
    print(f"machine: {platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}; "
          f"{DAYS} days x {args.rows_per_day} impressions, cutoff after day {CUTOFF_DAY}, judged on day {CUTOFF_DAY + 1} "
          f"with matured labels; 30% of conversions 1-7 days late, attribution 7d; zipper {ZIPPER}")
    rows = []
    for seed in args.seeds:
        got = run_seed(seed, args.rows_per_day, not args.no_linear, args.net_epochs, args.net_rules)
        print(f"seed {seed}: test day {got[0]['test_rows']} rows, {got[0]['test_conversions']} matured conversions; "
              f"timings {got[0]['timings']}", flush=True)
        rows += got
    res = pd.DataFrame(rows)
    cols = ["train_examples", "calib_all", "calib_truth_all", "calib_feed", "calib_search", "ne", "auc"]
    pd.set_option("display.width", 200)
    print("\nper seed:")
    print(res[["seed", "rule", *cols, "fit_s"]].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print("\nmean over seeds (calibration = sum(pred) / sum(matured labels); calib_truth: / sum(true p)):")
    mean = res.groupby("rule", sort=False)[cols].mean()
    print(mean.to_string(float_format=lambda v: f"{v:.4f}"))
    if {"net:zipper", "net:mask"} <= set(mean.index):
        z, m = res[res.rule == "net:zipper"].set_index("seed"), res[res.rule == "net:mask"].set_index("seed")
        rel = (z["ne"] / m["ne"] - 1) * 100
        print(f"\nnet: zipper's conversion NE against mask's: {rel.mean():+.2f}% (per seed {', '.join(f'{v:+.2f}%' for v in rel)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
