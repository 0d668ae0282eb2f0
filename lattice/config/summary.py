"""The short summary `lattice config check` prints for a valid config."""

from __future__ import annotations

from lattice.config.schema import PlatformConfig, SparseFeature

FLOAT_BYTES = 4


def table_rows(f: SparseFeature) -> int:
    """Row budget of the feature's embedding table(s): every scheme spends `num_embeddings` (QR
    over its two tables, learned over frequent, clustered and unseen rows; vocab's fitted table
    may be smaller; mixed may hold more, narrower rows within the same parameters)."""
    return f.num_embeddings


def embedding_bytes(config: PlatformConfig) -> int:
    """fp32 bytes of every feature's embedding parameters (`lattice.config.rules_hashing.embedding_params`:
    QR concat is half a table; vocab, learned and mixed at most a full one)."""
    from lattice.config.rules_hashing import embedding_params

    return sum(embedding_params(f) * FLOAT_BYTES for f in config.features.sparse)


def _lookup_note(f: SparseFeature) -> str:
    """The feature's id-lookup buffers (not parameters; the artifact carries them)."""
    from lattice.config.rules_hashing import lookup_bytes

    n = lookup_bytes(f)
    if n is None:
        return "  + lookup 16 B per fitted id"
    return f"  + lookup {_mib(n)}" if n else ""


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
        lines.append(f"  {s.name:<18} dim {s.embedding_dim:>4}  rows {table_rows(s):>10,}  hashing {s.hashing}{_lookup_note(s)}")
    return "\n".join(lines)
