"""The synthetic world: the generative model of the demo's multi-domain ad logs (see
`lattice.data.synth`), its tables, one chunk of impressions and the per-domain raw writers. The
static generator (`lattice.data.synth`) and the moving market (`lattice.data.synth_market`) both
build on it, so neither imports the other at run time."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from lattice.config.schema import Synthetic

K = 4  # latent dimension
N_SEGMENTS = 20
N_CATEGORIES = 60
N_DEVICES = 5
N_POSITIONS = 8
DOMAINS = ("feed", "search", "video")
DOMAIN_SHARE = np.array([0.5, 0.3, 0.2])
BASE_CLICK = np.array([-3.0, -2.2, -3.4])  # feed ~5%, search ~10%, video ~3% before effects
BASE_CVR = np.array([-2.0, -1.4, -9.0])  # video never converts (and logs no conversion)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


@dataclass
class World:
    """Every per-id table of the generative model, drawn once from the seed."""

    user_segment: np.ndarray
    user_vec: np.ndarray  # (U, K)
    user_bias: np.ndarray
    user_activity: np.ndarray
    user_cdf: np.ndarray
    ad_category: np.ndarray
    ad_vec: np.ndarray  # (A, K)
    ad_bias: np.ndarray
    ad_price: np.ndarray
    ad_cdf: np.ndarray
    segment_centers: np.ndarray  # (N_SEGMENTS, K): what a user's segment alone says of its vector
    category_centers: np.ndarray  # (N_CATEGORIES, K)
    domain_mix: np.ndarray  # (3, K, K) domain-specific interaction
    cvr_mix: np.ndarray  # (K, K)
    position_effect: np.ndarray
    device_effect: np.ndarray

    @classmethod
    def draw(cls, params: Synthetic, n_users: int, n_ads: int) -> "World":
        rng = np.random.default_rng([params.seed, 0])
        seg_centers = rng.normal(0, 0.7, (N_SEGMENTS, K))
        cat_centers = rng.normal(0, 0.7, (N_CATEGORIES, K))
        user_segment = rng.integers(0, N_SEGMENTS, n_users)
        ad_category = rng.integers(0, N_CATEGORIES, n_ads)

        def zipf_cdf(n: int) -> np.ndarray:
            w = 1.0 / np.arange(1, n + 1) ** params.zipf_exponent
            return np.cumsum(w) / w.sum()

        f32 = np.float32  # per-id tables dominate memory at millions of ids
        return cls(
            user_segment=user_segment.astype(np.int32),
            user_vec=(seg_centers[user_segment] + 0.35 * rng.normal(size=(n_users, K))).astype(f32),
            user_bias=(0.3 * rng.normal(size=n_users)).astype(f32),
            user_activity=rng.gamma(2.0, 1.0, n_users).astype(f32),
            user_cdf=zipf_cdf(n_users),
            ad_category=ad_category.astype(np.int32),
            ad_vec=(cat_centers[ad_category] + 0.35 * rng.normal(size=(n_ads, K))).astype(f32),
            ad_bias=(0.3 * rng.normal(size=n_ads)).astype(f32),
            ad_price=np.exp(rng.normal(2.0, 0.6, N_CATEGORIES)[ad_category] + 0.3 * rng.normal(size=n_ads)).astype(f32),
            ad_cdf=zipf_cdf(n_ads),
            segment_centers=seg_centers,
            category_centers=cat_centers,
            domain_mix=rng.normal(0, 0.4, (3, K, K)),
            cvr_mix=rng.normal(0, 0.5, (K, K)),
            position_effect=-0.25 * np.arange(N_POSITIONS),
            device_effect=rng.normal(0, 0.3, N_DEVICES),
        )


def id_space(params: Synthetic, rows: int) -> tuple[int, int]:
    """(users, ads) for a log of `rows` impressions: id spaces grow with N (millions at 10M rows)."""
    return max(params.users, rows // 4), max(params.ads, rows // 40)


def click_logit(world: World, d: np.ndarray, uv: np.ndarray, av: np.ndarray, user_bias: np.ndarray | float,
                ad_bias: np.ndarray | float, pos: np.ndarray, dev: np.ndarray, query_match: np.ndarray,
                activity: np.ndarray) -> np.ndarray:
    """The true click logit from its parts; the oracle-gap benchmark calls it with parts withheld
    (e.g. segment centres for user vectors) to measure what each kind of information is worth."""
    shared = np.einsum("nk,nk->n", uv, av)
    specific = np.einsum("nk,nkj,nj->n", uv, world.domain_mix[d], av)
    return (
        BASE_CLICK[d] + 0.6 * shared + 0.5 * specific + world.position_effect[pos]
        + np.where(d < 2, world.device_effect[dev], 0.0)
        + np.where((d == 1) & query_match, 1.0, 0.0)
        + 0.3 * (np.log1p(activity) - 1.0) + user_bias + ad_bias
    )


def _chunk(world: World, rng: np.random.Generator, n: int, t0: float, t1: float, day: "MarketDay | None" = None) -> pd.DataFrame:
    """n impressions with event times in [t0, t1) (unix seconds), in time order; `day` moves the
    market (lattice.data.synth_market), None keeps the static world."""
    d = rng.choice(3, n, p=DOMAIN_SHARE)
    # Zipf-popular ids: id 1 is the most popular user/ad, as in a frequency-ranked vocabulary.
    if day is None:
        u = np.searchsorted(world.user_cdf, rng.random(n))
        a = np.searchsorted(world.ad_cdf, rng.random(n))
    else:
        u, a = day.draw_ids(world, rng, n)
    ts = np.sort(rng.uniform(t0, t1, n)).astype(np.int64)
    pos = np.minimum(rng.geometric(0.35, n) - 1, N_POSITIONS - 1)
    dev = rng.integers(0, N_DEVICES, n)
    cat = world.ad_category[a]
    # search queries match the ad's category half the time; matches are much likelier to click
    query = np.where(rng.random(n) < 0.5, cat, rng.integers(0, N_CATEGORIES, n))
    activity = world.user_activity[u] * rng.lognormal(0, 0.2, n)
    price = world.ad_price[a] * rng.lognormal(0, 0.1, n)
    if day is not None:
        activity, price = activity * day.activity_scale, price * day.price_scale

    uv, av = world.user_vec[u], world.ad_vec[a]  # (n, K)
    logit = click_logit(world, d, uv, av, world.user_bias[u], world.ad_bias[a], pos, dev, query == cat, activity)
    p_click = _sigmoid(logit if day is None else logit + day.click_shift[d])
    cvr = _sigmoid(BASE_CVR[d] + 0.5 * np.einsum("nk,kj,nj->n", uv, world.cvr_mix, av) - 0.4 * (np.log(price) - 2.0) + world.ad_bias[a])
    p_conv = p_click * cvr
    click = rng.random(n) < p_click
    conv = click & (rng.random(n) < cvr)
    return pd.DataFrame(
        {
            "domain": d, "user_id": u + 1, "ad_id": a + 1, "user_segment": world.user_segment[u],
            "ad_category": cat, "device": dev, "position": pos, "query_category": query,
            "price": price.round(3), "activity": activity.round(4), "ts": ts,
            "click": click.astype(np.int8), "conversion": conv.astype(np.int8),
            "p_click": p_click.round(6), "p_conversion": p_conv.round(6),
        }
    )


def _write_feed(df: pd.DataFrame, path: Path) -> None:
    out = pd.DataFrame(
        {
            "uid": df.user_id, "aid": df.ad_id, "ts": df.ts, "device_type": df.device, "slot": df.position,
            "user_seg": df.user_segment, "ad_cat": df.ad_category, "price": df.price, "user_activity": df.activity,
            "clicked": df.click, "converted": df.conversion, "p_click": df.p_click, "p_conversion": df.p_conversion,
        }
    )
    if "conversion_ts" in df:  # a moving market logs when each conversion arrived (empty: none yet)
        out["conversion_ts"] = df.conversion_ts.astype("Int64")
    out.to_csv(path, index=False)


def _write_search(df: pd.DataFrame, path: Path) -> None:
    iso = pd.to_datetime(df.ts, unit="s", utc=True).dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    table = pa.table(
        {
            "event_time": iso.to_numpy(dtype=str), "user": df.user_id.to_numpy(), "ad": df.ad_id.to_numpy(),
            "segment": df.user_segment.to_numpy(), "category": df.ad_category.to_numpy(),
            "device": df.device.to_numpy(), "rank": df.position.to_numpy(), "query_cat": df.query_category.to_numpy(),
            # the ad server's relevance flag: the query names the ad's category (derivable from the
            # two columns above, logged as search ad servers log their query-ad match signals)
            "query_match": (df.query_category == df.ad_category).to_numpy().astype(np.int8),
            "bid_price": df.price.to_numpy(), "activity": df.activity.to_numpy(),
            "click": df.click.to_numpy(), "conversion": df.conversion.to_numpy(),
            "true_click": df.p_click.to_numpy(), "true_conversion": df.p_conversion.to_numpy(),
        }
    )
    if "conversion_ts" in df:
        at = pd.to_datetime(df.conversion_ts, unit="s", utc=True).dt.strftime("%Y-%m-%dT%H:%M:%SZ")
        table = table.append_column("conversion_time", pa.array(at.where(df.conversion_ts.notna(), None).tolist(), pa.string()))
    pq.write_table(table, path, compression="snappy")


def _write_video(df: pd.DataFrame, path: Path) -> None:
    out = pd.DataFrame(
        {
            "viewer_id": df.user_id, "creative_id": df.ad_id, "timestamp_ms": df.ts * 1000,
            "viewer_segment": df.user_segment, "creative_category": df.ad_category, "placement": df.position,
            "engagement": df.activity, "is_click": df.click, "truth_click": df.p_click,
        }
    )
    out.to_json(path, orient="records", lines=True)


WRITERS = {"feed": (_write_feed, "csv"), "search": (_write_search, "parquet"), "video": (_write_video, "jsonl")}


def clear_parts(folder: Path) -> None:
    """A rerun replaces the whole output: part files of an earlier run, in date= folders or not."""
    for stale in [*folder.glob("part-*"), *folder.glob("date=*/part-*")]:
        stale.unlink()
    for day in folder.glob("date=*"):
        if day.is_dir() and not any(day.iterdir()):
            day.rmdir()


@dataclass
class MarketDay:
    """One day's state of the market, drawn by `lattice.data.synth_market.market_days`, read by `_chunk`."""

    index: int
    known_users: int  # ids [0, known_users) existed before this day
    known_ads: int
    new_users: tuple[int, int]  # [lo, hi): ids first seen today
    new_ads: tuple[int, int]
    new_share: float
    click_shift: np.ndarray  # (3,) added to each domain's click logit
    price_scale: float = 1.0
    activity_scale: float = 1.0

    def draw_ids(self, world: World, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        def draw(cdf: np.ndarray, known: int, new: tuple[int, int]) -> np.ndarray:
            # Zipf over the ids known before today: scale the uniform draw into their share of the cdf
            ids = np.searchsorted(cdf, rng.random(n) * cdf[known - 1])
            lo, hi = new
            if hi > lo:
                fresh = rng.random(n) < self.new_share
                ids[fresh] = rng.integers(lo, hi, int(fresh.sum()))
            return ids

        return draw(world.user_cdf, self.known_users, self.new_users), draw(world.ad_cdf, self.known_ads, self.new_ads)
