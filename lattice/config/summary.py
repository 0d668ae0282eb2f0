"""The short summary `lattice config check` prints for a valid config."""

from __future__ import annotations

from lattice.config.schema import PlatformConfig, SparseFeature

FLOAT_BYTES = 4


def table_rows(f: SparseFeature) -> int:
    """Rows the feature's embedding table(s) hold: every scheme spends `num_embeddings` as its
    row budget (QR over its two tables, learned over frequent, clustered and unseen rows)."""
    return f.num_embeddings


def embedding_bytes(config: PlatformConfig) -> int:
    return sum(table_rows(f) * f.embedding_dim * FLOAT_BYTES for f in config.features.sparse)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def render_summary(config: PlatformConfig) -> str:
    objs = config.objective_names
    width = max(len(d) for d in config.domain_names + ["domain"])
    lines = [f"config {config.name!r}: {config.description}".rstrip(": "), ""]
    lines.append("domain × objective (✓ = labelled, · = masked)")
    header = " " * (width + 2) + "  ".join(f"{o:^10}" for o in objs)
    lines.append(header)
    for d in config.domain_names:
        marks = "  ".join(f"{('✓' if config.carries(d, o) else '·'):^10}" for o in objs)
        lines.append(f"  {d:<{width}}{marks}")
    f = config.features
    lines += [
        "",
        f"sources: {len(config.sources)} ({', '.join(f'{s.name}:{s.format}' for s in config.sources)})",
        f"features: {len(f.sparse)} sparse, {len(f.dense)} dense, "
        f"{sum(len(a.windows) * len(a.statistics) for a in f.aggregates)} aggregate columns from {len(f.aggregates)} aggregates",
        f"cells: {len(config.cells())} (domain, objective) pairs with labels",
        f"embedding tables: {_mib(embedding_bytes(config))} fp32 "
        f"({_mib(embedding_bytes(config) // 4)} at int8)",
    ]
    for s in f.sparse:
        lines.append(f"  {s.name:<18} dim {s.embedding_dim:>4}  rows {table_rows(s):>10,}  hashing {s.hashing}")
    return "\n".join(lines)
