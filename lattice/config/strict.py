"""The base of every config section: unknown keys are errors, values are frozen.

Its own module so the config's section modules (timing, monitoring, ...) build on it without
importing `schema.py`, which imports them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    # use_attribute_docstrings: the string under each field becomes its description, which the
    # config reference (lattice/config/reference.py) is generated from
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
