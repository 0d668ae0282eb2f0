"""The per-feature compression modules in front of the EmbeddingBagCollection, by their old
import path. The interface and its contract are in `lattice.hashing.base`, each scheme has its own
module, and the name -> builder registry with the factory is `lattice.hashing.registry`; this
module only re-exports their public names for existing callers."""

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
