"""Per-feature compression modules in front of the EmbeddingBagCollection.

One interface for every `hashing` scheme (`Compression`): a feature's bags (values (N,), lengths
(B,)) become one or more streams, each a (values, lengths) pair keyed by a sub-key that names one
EBC table; after SUM pooling, `combine` turns the sub-keys' pooled (B, w_k) embeddings back into
the feature's (B, d) embedding. Single-table schemes (none, modulo, vocab, learned, zch) are a
remap of the ids (`RemapCompression`): one stream keyed by the feature's own name, combine is the
identity, so the EBC sees exactly the KJT it saw before compression existed. Multi-table schemes
(`qr`, `mixed`) emit several streams and combine them (lattice.hashing.qr, lattice.hashing.mixed).

Every module here is FX-traceable and its traced graph scriptable (no data-dependent Python
branches): the exported TorchScript artifact runs the same code on the same buffers. The one
exception, zch, trains a TorchRec managed-collision module and becomes a frozen lookup in the
artifact (`ZCHRemap.frozen`).

The code is split by job: the shared interface in `lattice.hashing.base`, one module per scheme,
and the name -> builder registry with the factory in `lattice.hashing.registry`. This module
re-exports their public names for existing callers.
"""

from lattice.hashing.base import (  # noqa: F401 (re-exported)
    FIT_COMMAND,
    Compression,
    FittedLookup,
    KJTCompress,
    RemapCompression,
    TableSpec,
    _i64,
    compressions,
    fitted_map,
    lookup_buffer_bytes,
    lookup_from_map,
    require_fitted,
    sorted_lookup,
)
from lattice.hashing.registry import make_compression, single_table_remap  # noqa: F401 (re-exported)
