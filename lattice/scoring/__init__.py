"""Batch scoring of a user's own tables (`lattice predict`)."""
