"""Compressed embeddings: fitted id maps (vocab, learned, mixed), QR, zero-collision tables."""
