"""Distillation: the teacher's stored scores teach the small student (asynchronous, as in Lattice:
the student never runs the teacher inline)."""
