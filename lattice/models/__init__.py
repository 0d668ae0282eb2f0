"""Models: the Lattice MDMO network (teacher and student sizes) and the baselines, built from
named parts (sparse arch, dense arch, interaction stack, domain arch, heads). `build_model` is
the entry point."""

from lattice.models.build import MODEL_KINDS, build_model, kind_of

__all__ = ["MODEL_KINDS", "build_model", "kind_of"]
