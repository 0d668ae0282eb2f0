"""The synthetic market over days (`synthetic.market`): what changes from one day to the next.

Built on the static world of `lattice.data.synth` (same users, ads and click model), day k of
`synthetic.days` (k = 0 at `time_range.start`):
  - ids: the first day knows the base id space; every later day adds `new_users_per_day` users
    and `new_ads_per_day` ads never seen before, which take `new_id_share` of that day's
    impressions; known ids keep their Zipf popularity (new ids rank after them);
  - drift: each domain's click logit takes a random-walk step N(0, ctr_drift) per day;
  - shock: from `shock.day` on, one domain's click logit moves or one feature is rescaled;
  - conversions arrive after a delay (`conversion_delay`) and are logged with their own time
    (`conversion_ts` in feed, `conversion_time` in search); one arriving after the log ends is not
    in the raw log (converted 0, no time), as a real export would show it.
The logged true probabilities include drift and shock, so the oracle stays exact.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pandas as pd

from lattice.config import PlatformConfig
from lattice.config.timing import Market
from lattice.data.synth_world import DOMAINS, WRITERS, MarketDay, World, _chunk, clear_parts, id_space  # noqa: F401 (MarketDay: its home is the world the chunks are drawn from)
from lattice.progress import progress_bar


def market_days(market: Market, days: int, base_users: int, base_ads: int, seed: int) -> list[MarketDay]:
    """Every day's state, drawn from the seed alone (not from the rows), so the drift of a day is
    the same at any log size."""
    rng = np.random.default_rng([seed, 2])
    steps = rng.normal(0.0, market.ctr_drift, (days, 3)) if market.ctr_drift else np.zeros((days, 3))
    steps[0] = 0.0  # day 0 is the static world
    walk = np.cumsum(steps, axis=0)
    out = []
    for k in range(days):
        shift = walk[k].copy()
        price = activity = 1.0
        sh = market.shock
        if sh is not None and k >= sh.day:
            if sh.domain is not None:
                shift[DOMAINS.index(sh.domain)] += sh.click_logit_shift
            elif sh.feature == "price":
                price = sh.scale
            else:
                activity = sh.scale
        users_lo = base_users + market.new_users_per_day * max(k - 1, 0)
        ads_lo = base_ads + market.new_ads_per_day * max(k - 1, 0)
        users_hi = users_lo + (market.new_users_per_day if k else 0)
        ads_hi = ads_lo + (market.new_ads_per_day if k else 0)
        out.append(MarketDay(k, users_lo, ads_lo, (users_lo, users_hi), (ads_lo, ads_hi), market.new_id_share,
                             shift, price, activity))
    return out


def conversion_delays(market: Market, rng: np.random.Generator, n: int) -> np.ndarray:
    """Seconds from impression to logged conversion, for n conversions."""
    cd = market.conversion_delay
    late = rng.random(n) < cd.delayed_share
    prompt = rng.uniform(0, cd.prompt_hours * 3600, n)
    days = rng.uniform(cd.min_days, cd.max_days, n) * 86400
    return np.where(late, days, prompt)


def generate_market(config: PlatformConfig, rows: int, out: str | Path, progress: bool = True) -> dict:
    params = config.synthetic
    market = params.market
    out = Path(out)
    base_users, base_ads = id_space(params, rows)
    n_users = base_users + market.new_users_per_day * max(params.days - 1, 0)
    n_ads = base_ads + market.new_ads_per_day * max(params.days - 1, 0)
    world = World.draw(params, n_users, n_ads)
    start = dt.datetime.combine(config.time_range.start, dt.time(), tzinfo=dt.timezone.utc).timestamp()
    log_end = start + params.days * 86400.0
    days = market_days(market, params.days, base_users, base_ads, params.seed)
    per_day = [rows // params.days + (1 if k < rows % params.days else 0) for k in range(params.days)]
    for name in DOMAINS:
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        clear_parts(folder)

    counts = {d: 0 for d in DOMAINS}
    sums = {d: {"click": 0, "conversion": 0, "p_click": 0.0, "p_conversion": 0.0, "conversions_after_log_end": 0,
                "conversions_late": 0} for d in DOMAINS}
    bar = progress_bar(total=rows, unit="rows", desc="synth market", enabled=progress)
    part = 0
    for k, day in enumerate(days):
        n_day = per_day[k]
        n_chunks = max(1, -(-n_day // params.chunk_rows))
        seeds = np.random.SeedSequence([params.seed, 3, k]).spawn(n_chunks)
        date = (config.time_range.start + dt.timedelta(days=k)).isoformat()
        for i in range(n_chunks):
            n = min(params.chunk_rows, n_day - i * params.chunk_rows)
            t0 = start + 86400.0 * (k + i / n_chunks)
            rng = np.random.default_rng(seeds[i])
            df = _chunk(world, rng, n, t0, start + 86400.0 * (k + (i + 1) / n_chunks), day)
            conv = df.conversion.to_numpy() == 1
            arrive = df.ts.to_numpy().astype(np.float64)
            arrive[conv] += conversion_delays(market, rng, int(conv.sum()))
            lost = conv & (arrive >= log_end)
            df["conversion"] = np.where(lost, 0, df.conversion).astype(np.int8)
            df["conversion_ts"] = pd.array(np.where(conv & ~lost, arrive, np.nan), dtype="Float64").round(0)
            for di, name in enumerate(DOMAINS):
                rows_d = df[df.domain == di]
                if rows_d.empty:
                    continue
                writer, ext = WRITERS[name]
                folder = out / name / f"date={date}" if market.partition_by_date else out / name
                folder.mkdir(parents=True, exist_ok=True)
                writer(rows_d, folder / f"part-{part:05d}.{ext}")
                counts[name] += len(rows_d)
                acc = sums[name]
                acc["click"] += int(rows_d.click.sum())
                acc["p_click"] += float(rows_d.p_click.sum())
                if name != "video":
                    sel = (df.domain == di).to_numpy()
                    acc["conversion"] += int(rows_d.conversion.sum())
                    acc["p_conversion"] += float(rows_d.p_conversion.sum())
                    acc["conversions_after_log_end"] += int((lost & sel).sum())
                    delay = arrive - df.ts.to_numpy()
                    acc["conversions_late"] += int((conv & ~lost & sel & (delay >= 86400 * market.conversion_delay.min_days)).sum())
            part += 1
            bar.update(n)
    bar.close()
    manifest = {
        "rows": rows, "users": n_users, "ads": n_ads, "seed": params.seed, "chunks": part,
        "rows_per_domain": counts,
        "label_sums": {d: {k: round(v, 3) for k, v in sums[d].items()} for d in DOMAINS},
        "formats": {d: WRITERS[d][1] for d in DOMAINS},
        "market": {
            "days": params.days, "log_end": dt.datetime.fromtimestamp(log_end, dt.timezone.utc).isoformat(),
            "rows_per_day": per_day, "partition_by_date": market.partition_by_date,
            "new_ids": [{"day": d.index, "users": list(d.new_users), "ads": list(d.new_ads)} for d in days],
            "click_shift": {name: [round(float(d.click_shift[i]), 4) for d in days] for i, name in enumerate(DOMAINS)},
            "price_scale": [d.price_scale for d in days], "activity_scale": [d.activity_scale for d in days],
            "config": market.model_dump(mode="json"),
        },
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest
