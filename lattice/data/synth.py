"""Synthetic multi-domain ad logs with known label probabilities (the demo's embedded dataset).

The generative model, in short (all tables drawn once from the seed):

    user u: segment s(u), latent vector  v_u = S[s(u)] + 0.35·ε_u   (k=4), activity level
    ad a:   category c(a), latent vector w_a = C[c(a)] + 0.35·ε_a,  price ~ lognormal by category
    click logit  = base_click[d] + v_u·w_a + v_u·D_d·w_a (domain-specific) + position + device
                   + query match (search) + 0.3·activity + user/ad bias
    P(conversion) = P(click) · σ(base_cvr[d] + v_u·W·w_a − 0.4·log price + ...)

So structure is shared across domains with domain-specific effects, and a conversion only
follows a click. Each domain writes a different raw schema (names, file format, time format,
a missing feature, video has no conversion label), which the feature pipeline must reconcile.
The true probabilities are written next to the labels for the oracle NE; trainers never read them.

Rows stream out in chunks (one part file per domain and chunk), so memory stays flat in N.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np

from lattice.config import PlatformConfig
from lattice.config.schema import Synthetic
from lattice.data.synth_world import (DOMAINS, WRITERS, World, _chunk, _sigmoid, clear_parts, click_logit,  # noqa: F401
                                      id_space)
from lattice.progress import progress_bar


def generate(config: PlatformConfig, rows: int, out: str | Path, progress: bool = True) -> dict:
    """Write `rows` impressions as per-domain raw logs under `out`; return a manifest."""
    params = config.synthetic or Synthetic()
    if params.market is not None:
        from lattice.data.synth_market import generate_market

        return generate_market(config, rows, out, progress)
    out = Path(out)
    n_users, n_ads = id_space(params, rows)
    world = World.draw(params, n_users, n_ads)
    start = dt.datetime.combine(config.time_range.start, dt.time(), tzinfo=dt.timezone.utc).timestamp()
    span = params.days * 86400.0
    n_chunks = max(1, -(-rows // params.chunk_rows))
    seeds = np.random.SeedSequence([params.seed, 1]).spawn(n_chunks)
    counts = {d: 0 for d in DOMAINS}
    positives: dict[str, dict[str, float]] = {d: {"click": 0, "conversion": 0, "p_click": 0.0, "p_conversion": 0.0} for d in DOMAINS}
    for name in DOMAINS:
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        clear_parts(folder)

    bar = progress_bar(total=rows, unit="rows", desc="synth", enabled=progress)
    for i in range(n_chunks):
        n = min(params.chunk_rows, rows - i * params.chunk_rows)
        t0 = start + span * i / n_chunks
        df = _chunk(world, np.random.default_rng(seeds[i]), n, t0, start + span * (i + 1) / n_chunks)
        for di, name in enumerate(DOMAINS):
            part = df[df.domain == di]
            if part.empty:
                continue
            writer, ext = WRITERS[name]
            writer(part, out / name / f"part-{i:05d}.{ext}")
            counts[name] += len(part)
            acc = positives[name]
            acc["click"] += int(part.click.sum())
            acc["p_click"] += float(part.p_click.sum())
            if name != "video":
                acc["conversion"] += int(part.conversion.sum())
                acc["p_conversion"] += float(part.p_conversion.sum())
        bar.update(n)
    bar.close()
    manifest = {
        "rows": rows, "users": n_users, "ads": n_ads, "seed": params.seed, "chunks": n_chunks,
        "rows_per_domain": counts,
        "label_sums": {d: {k: round(v, 3) for k, v in positives[d].items()} for d in DOMAINS},
        "formats": {d: WRITERS[d][1] for d in DOMAINS},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest
