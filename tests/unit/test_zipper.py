"""Zipper heads (training.label_delay: zipper): the config is checked naming its key, the loader
hands each head exactly its rows' labels and masks at a cutoff, the model grows the shorter heads
and the loss trains each example on its own window's head only, and the exported artifact is the
model without them (same outputs, same numbers)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from lattice.config import load_config
from lattice.config.loader import ConfigError
from lattice.data import schema as S
from lattice.data.zipper import head_key, window_index

ROOT = Path(__file__).resolve().parents[2]
MARKET = ROOT / "bench" / "configs" / "demo_market.yaml"
TRAINING = "training: {batch_size: 1024,"
ZIPPER = "training: {label_delay: zipper, zipper: {windows: [1d, 3d, 7d], shares: [0.3, 0.3, 0.4]}, batch_size: 1024,"
T0 = dt.datetime(2026, 1, 5, 12, 0)


def _load(tmp_path: Path, old: str = TRAINING, new: str = ZIPPER, edits: tuple[tuple[str, str], ...] = ()):
    text = MARKET.read_text()
    for a, b in ((old, new), *edits):
        assert a in text, a
        text = text.replace(a, b)
    path = tmp_path / "market.yaml"
    path.write_text(text)
    return load_config(path)


@pytest.fixture(scope="module")
def zipper_cfg(tmp_path_factory):
    return _load(tmp_path_factory.mktemp("cfg"))


# ---------------------------------------------------------------- config


def test_zipper_config_loads(zipper_cfg) -> None:
    z = zipper_cfg.training.zipper
    assert zipper_cfg.training.label_delay == "zipper"
    assert z.spans() == [dt.timedelta(days=1), dt.timedelta(days=3), dt.timedelta(days=7)]
    assert z.share_list() == [0.3, 0.3, 0.4]


@pytest.mark.parametrize("windows, key, says", [
    ("[3d, 1d, 7d]", "training.zipper", "strictly increasing"),
    ("[1d, 3d, 3d]", "training.zipper", "strictly increasing"),
    ("[1d, 3d, 9d]", "training.zipper.windows", "at most 7d"),
    ("[1d, 1w]", "training.zipper", "30m, 12h or 7d"),
    ("[7d]", "training.zipper.windows", "at least 2"),
])
def test_a_bad_windows_config_is_refused_naming_the_key(tmp_path, windows, key, says) -> None:
    new = ZIPPER.replace("[1d, 3d, 7d], shares: [0.3, 0.3, 0.4]", windows)
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, new=new)
    msg = str(e.value)
    assert key in msg and says in msg and "market.yaml" in msg, msg


def test_a_window_longer_than_the_retention_is_refused(tmp_path) -> None:
    # attribution 20d fits the 21-day time_range; a 25d Zipper window fits neither
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, new=ZIPPER.replace("7d]", "25d]"), edits=(("attribution: 7d}", "attribution: 20d}"),))
    msg = str(e.value)
    assert "training.zipper.windows" in msg and "longer than time_range" in msg and "at most 20d" in msg


@pytest.mark.parametrize("new, key, says", [
    ("training: {label_delay: zipper, batch_size: 1024,", "training.zipper.windows", "give its windows"),
    ("training: {zipper: {windows: [1d, 7d]}, batch_size: 1024,", "training.zipper", "only read with training.label_delay: zipper"),
    (ZIPPER.replace("shares: [0.3, 0.3, 0.4]", "shares: [0.5, 0.5]"), "training.zipper", "one share per window"),
    (ZIPPER.replace("shares: [0.3, 0.3, 0.4]", "shares: [0.5, 0.3, 0.4]"), "training.zipper", "sum to 1"),
])
def test_zipper_and_label_delay_must_agree(tmp_path, new, key, says) -> None:
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, new=new)
    assert key in str(e.value) and says in str(e.value), str(e.value)


def test_zipper_without_a_delayed_objective_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, edits=(("attribution: 7d}", "}"), (", known_at: conversion_ts}", "}"),
                                 (", known_at: conversion_time}", "}")))
    assert "training.label_delay" in str(e.value) and "no objective has an attribution window" in str(e.value)


# ---------------------------------------------------------------- data: per-head labels at a cutoff


def _hand_log() -> pd.DataFrame:
    """Six feed impressions at T0 (two per window, ids chosen by their hash) and one search
    impression of a window-0 id whose conversion mask is 0 (a domain without the label)."""
    shares = [0.3, 0.3, 0.4]
    pool = [f"imp{i}" for i in range(200)]
    k = window_index(pool, shares)
    ids: list[str] = []
    for w in (0, 0, 1, 1, 2, 2):
        ids.append(next(e for e, j in zip(pool, k) if j == w and e not in ids))
    ts = pd.Timestamp(T0, tz="UTC")
    h = pd.Timedelta(hours=1)
    # per window: one converts at +12h, the other at +2d (k 0, 1) or +5d (k 2); the last row never
    known = [ts + 12 * h, ts + 48 * h, ts + 12 * h, ts + 48 * h, ts + 120 * h, pd.NaT]
    label = [1, 1, 1, 1, 1, 0]
    return pd.DataFrame({
        "example_id": ids + [ids[0] + "x"],
        "event_timestamp": [ts] * 7,
        "domain": ["feed"] * 6 + ["video"],
        S.label_column("conversion"): np.array(label + [0], np.int8),
        S.mask_column("conversion"): np.array([1] * 6 + [0], np.int8),
        S.known_column("conversion"): known + [pd.NaT],
    })


def test_head_labels_and_masks_on_a_hand_built_log_are_exact() -> None:
    from lattice.data.zipper import head_labels

    df = _hand_log()
    assert window_index(df.example_id[:6], [0.3, 0.3, 0.4]).tolist() == [0, 0, 1, 1, 2, 2]
    windows = [dt.timedelta(days=d) for d in (1, 3, 7)]
    day = dt.timedelta(days=1)

    def at(cutoff):
        heads = head_labels(df, "conversion", cutoff, windows, [0.3, 0.3, 0.4])
        return [(h[0].tolist(), h[1].tolist()) for h in heads.values()]

    z = [0] * 7
    # before any window closes nothing trains
    assert at(T0 + day - dt.timedelta(seconds=1)) == [(z, z)] * 3
    # the 1-day window closes: rows 0, 1 train head 0; only row 0's conversion (12h) came within it
    got = at(T0 + day)
    assert got[0] == ([1, 0, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0]) and got[1] == got[2] == (z, z)
    # 3 days: head 1's rows, both conversions (12h, 2d) within 3 days; head 2 still open
    got = at(T0 + 3 * day)
    assert got[0] == ([1, 0, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0])
    assert got[1] == ([0, 0, 1, 1, 0, 0, 0], [0, 0, 1, 1, 0, 0, 0]) and got[2] == (z, z)
    # 7 days: head 2's rows; the 5-day conversion counts, the never-converted row is a negative
    got = at(T0 + 7 * day)
    assert got[2] == ([0, 0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 1, 1, 0])
    # the video row (mask 0) never trains any head, and no row trains two heads
    assert at(None) == got
    masks = np.array([m for _, m in got])
    assert masks.sum(0).max() == 1 and masks[:, 6].sum() == 0


def test_the_loader_hands_each_head_its_rows(zipper_cfg, tmp_path: Path) -> None:
    """Through the training reader at a cutoff: the objective's own label/mask follow `mask`, and
    the heads' columns equal head_labels on the same rows."""
    from lattice.data.label_time import mask_at_cutoff
    from lattice.data.loader import BatchLoader, fit_dense_stats
    from lattice.data.local_consolidate import write_parquet
    from lattice.data.zipper import head_labels

    df = _hand_log()
    for c in zipper_cfg.features.sparse:
        df[c.column] = 1
    for c in zipper_cfg.features.dense:
        df[c.column] = 1.0
    df[S.label_column("click")] = 1
    df[S.mask_column("click")] = 1
    root = tmp_path / "table"
    write_parquet(df, root / "part-0.parquet")
    stats = fit_dense_stats(zipper_cfg, root)
    cutoff = T0 + dt.timedelta(days=3)
    windows, shares = zipper_cfg.training.zipper.spans(), zipper_cfg.training.zipper.share_list()
    want = head_labels(df, "conversion", cutoff, windows, shares)
    main = mask_at_cutoff(df, cutoff, zipper_cfg)
    (b,) = list(BatchLoader(zipper_cfg, root, stats, "all", batch_size=64, shuffle=False, num_workers=0, label_cutoff=cutoff))
    order = [list(df.example_id).index(e) for e in b.example_ids]
    for k in range(3):
        assert b.zipper_labels["conversion"][:, k].tolist() == want[k][0][order].tolist()
        assert b.zipper_masks["conversion"][:, k].tolist() == want[k][1][order].tolist()
    assert b.masks["conversion"].tolist() == main[S.mask_column("conversion")].to_numpy()[order].tolist()
    assert b.masks["conversion"].sum() == 0  # the 7-day window is open at 3 days: `mask` leaves all out
    assert set(b.zipper_labels) == {"conversion"}  # click has no delay and no heads


# ---------------------------------------------------------------- model and loss


def _tiny(cfg):
    from lattice.training.tiny import tiny

    return tiny(cfg)


def _batch(cfg, n: int = 60, seed: int = 0, zipper: bool = True):
    from lattice.data.batch import Batch, kjt_from_ids

    rng = np.random.default_rng(seed)
    names = [f.name for f in cfg.features.sparse]
    domain = torch.tensor([0, 1, 2] * (n // 3))
    labels = {o: torch.from_numpy(rng.integers(0, 2, n).astype(np.float32)) for o in cfg.objective_names}
    masks = {o: torch.ones(n) for o in cfg.objective_names}
    b = Batch(dense=torch.from_numpy(rng.normal(size=(n, 2)).astype(np.float32)),
              sparse=kjt_from_ids(names, [rng.integers(0, 16, n) for _ in names], [rng.uniform(size=n) < 0.8 for _ in names]),
              domain=domain, labels=labels, masks=masks, example_ids=np.array([str(i) for i in range(n)]))
    if zipper:
        k = torch.from_numpy(rng.integers(0, 3, n))
        m = torch.nn.functional.one_hot(k, 3).float() * (rng.uniform(size=(n, 1)) < 0.7)  # some rows' window open
        b.zipper_labels = {"conversion": m * torch.from_numpy(rng.integers(0, 2, (n, 1)).astype(np.float32))}
        b.zipper_masks = {"conversion": m}
    return b


@pytest.mark.parametrize("kind, teacher", [("teacher", False), ("student", False), ("student", True)])
def test_each_example_trains_only_its_windows_head(zipper_cfg, kind, teacher) -> None:
    """Also when distilled: the teacher's soft labels teach the served (longest) head only."""
    from lattice.models import build_model
    from lattice.training.loss import mdmo_loss

    cfg = _tiny(zipper_cfg)
    torch.manual_seed(0)
    model = build_model(cfg, kind, 2).train()
    assert set(model.zipper) == {"conversion"} and len(model.zipper["conversion"]) == 2
    b = _batch(cfg)
    if teacher:
        b.teacher = {o: torch.full((len(b),), 0.3) for o in cfg.objective_names}
        b.teacher_mask = torch.ones(len(b))
    out = model(*b.inputs())
    assert set(out) == {"click", "conversion", head_key("conversion", 0), head_key("conversion", 1)}
    for v in out.values():
        v.retain_grad()
    mdmo_loss(cfg, out, b).total.backward()
    m = b.zipper_masks["conversion"]
    for k, key in enumerate([head_key("conversion", 0), head_key("conversion", 1), "conversion"]):
        g = out[key].grad
        if teacher and key == "conversion":
            assert torch.all(g != 0)  # soft labels reach every row of the served head
            continue
        assert torch.all(g[m[:, k] == 0] == 0), key  # no gradient from another window's rows or an open one
        assert torch.all(g[m[:, k] == 1] != 0), key
    # evaluation and export see the objectives only
    assert set(model.eval()(*b.inputs())) == {"click", "conversion"}


def test_zipper_loss_is_the_sum_of_each_heads_masked_bce(zipper_cfg) -> None:
    import torch.nn.functional as F

    from lattice.training.loss import mdmo_loss

    cfg = _tiny(zipper_cfg)
    b = _batch(cfg)
    n = len(b)
    torch.manual_seed(1)
    logits = {o: torch.randn(n) for o in ("click", "conversion", head_key("conversion", 0), head_key("conversion", 1))}
    got = mdmo_loss(cfg, logits, b).label["conversion"]
    y, m = b.zipper_labels["conversion"], b.zipper_masks["conversion"]
    want = sum((F.binary_cross_entropy_with_logits(logits[key], y[:, k], reduction="none") * m[:, k]).sum() / n
               for k, key in enumerate([head_key("conversion", 0), head_key("conversion", 1), "conversion"]))
    torch.testing.assert_close(got, want)
    # a model without the heads (a baseline) trains its objective on the `mask` label and mask
    plain = {o: logits[o] for o in ("click", "conversion")}
    want = (F.binary_cross_entropy_with_logits(plain["conversion"], b.labels["conversion"], reduction="none")
            * b.masks["conversion"]).sum() / n
    torch.testing.assert_close(mdmo_loss(cfg, plain, b).label["conversion"], want)


def test_a_tiny_zipper_model_trains_and_exports_as_the_model_without_it(zipper_cfg) -> None:
    """Train a few steps with Zipper heads; the artifact scripted from it has the outputs of the
    same network built without Zipper (mask) and loaded with its weights minus the shorter heads,
    number for number."""
    from lattice.export.serving_module import script
    from lattice.models import build_model
    from lattice.training.loss import mdmo_loss

    cfg = _tiny(zipper_cfg)
    plain_cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={"label_delay": "mask", "zipper": None})})
    torch.manual_seed(0)
    model = build_model(cfg, "student", 2)
    model.set_output_bias({"click": 0.1, "conversion": 0.01})
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    b = _batch(cfg, n=90)
    first = None
    for _ in range(30):
        model.train()
        loss = mdmo_loss(cfg, model(*b.inputs()), b).total
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
    assert loss.item() < first  # it learns
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("zipper.")}
    assert len(state) < len(model.state_dict())
    plain = build_model(plain_cfg, "student", 2)
    assert plain.zipper is None
    plain.load_state_dict(state)  # strict: the same network, parameter for parameter
    model.eval()
    plain.eval()
    got, want = script(model)(*b.inputs()), script(plain)(*b.inputs())
    assert set(got) == set(want) == {"click", "conversion"}
    for o in want:
        torch.testing.assert_close(got[o], want[o], rtol=0, atol=0)
        torch.testing.assert_close(got[o], torch.sigmoid(model(*b.inputs())[o]))


def test_warm_start_across_the_label_rule(zipper_cfg) -> None:
    """A `mask` parent warm-starts a Zipper model with fresh shorter heads; a Zipper parent cannot
    warm-start a `mask` model (its heads would be dropped), refused naming label_delay."""
    from lattice.models import build_model
    from lattice.training.warm_start import WarmStartError, check_compatible

    cfg = _tiny(zipper_cfg)
    plain = cfg.model_copy(update={"training": cfg.training.model_copy(update={"label_delay": "mask", "zipper": None})})

    def blob(c):
        return {"kind": "teacher", "config": c.model_dump(mode="json"), "state_dict": build_model(c, "teacher", 2).state_dict()}

    fresh = check_compatible(build_model(cfg, "teacher", 2), blob(plain), cfg, "teacher")
    assert fresh and all(k.startswith("zipper.conversion.") for k in fresh)
    with pytest.raises(WarmStartError, match=r"training\.label_delay.*warm_start: none"):
        check_compatible(build_model(plain, "teacher", 2), blob(cfg), plain, "teacher")
