"""Feast's serialized entity key for one int64 join key, built without Feast on the hot path.

Both online readers (SQLite, Redis) address rows by `serialize_entity_key(EntityKey(...))`; for a
single int64 key that is a fixed prefix, the id as little-endian int64 and a fixed suffix. The
template is taken once per join key from Feast's own encoder and kept only if it reproduces it
for sample ids, so a change of Feast's encoding falls back to the encoder instead of missing rows.
"""

from __future__ import annotations

import struct


def feast_key(join_key: str, i: int, version: int) -> bytes:
    from feast.infra.key_encoding_utils import serialize_entity_key
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.protos.feast.types.Value_pb2 import Value

    return serialize_entity_key(EntityKey(join_keys=[join_key], entity_values=[Value(int64_val=i)]),
                                entity_key_serialization_version=version)


def key_template(join_key: str, version: int) -> tuple[bytes, bytes] | None:
    """(prefix, suffix) around the packed id, or None when Feast's encoding is not of that shape."""
    probe = 0x0102030405060708  # bytes that occur nowhere else in the key
    key, packed = feast_key(join_key, probe, version), struct.pack("<q", probe)
    at = key.find(packed) if key.count(packed) == 1 else -1
    if at < 0:
        return None
    pre, post = key[:at], key[at + 8:]
    if any(pre + struct.pack("<q", i) + post != feast_key(join_key, i, version) for i in (1, -1, 123456789, 2**62 + 7)):
        return None
    return pre, post


def encode_keys(join_key: str, ids: list[int], version: int, template: tuple[bytes, bytes] | None) -> list[bytes]:
    if template is None:  # ~20 us per key through Feast's encoder
        return [feast_key(join_key, i, version) for i in ids]
    pre, post = template
    pack = struct.Struct("<q").pack
    return [pre + pack(i) + post for i in ids]


def field_key(view: str, feature: str) -> bytes:
    """The hash field Feast's Redis online store writes a feature under: murmur3_32 (unsigned, seed
    0) of `<view>:<feature>`, 4 bytes little-endian (feast/infra/online_stores/redis.py,
    `_mmh3` in helpers.py; a unit test holds the two equal)."""
    import mmh3

    return struct.pack("<I", mmh3.hash(f"{view}:{feature}", signed=False))
