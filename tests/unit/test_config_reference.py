"""The config reference is generated from the schema: every key has a docstring, and the committed
page is what the generator writes today."""

from __future__ import annotations

from pathlib import Path

import pytest

from lattice.config.reference import models, render_reference, type_name, yaml_inline
from lattice.config.schema import EventTime, ModelSize, PlatformConfig, Source

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "config-reference.md"
FIELDS = [(m.__name__, name, f) for m, _ in models() for name, f in m.model_fields.items()]


def test_every_model_is_reached_once_in_order() -> None:
    found = [m for m, _ in models()]
    assert found[0] is PlatformConfig
    assert len(found) == len(set(found))
    assert {Source, EventTime, ModelSize} <= set(found)
    where = dict(models())
    assert where[ModelSize] == ["models.teacher", "models.student", "models.baselines.size"]
    assert where[EventTime] == ["sources[].event_time"]


@pytest.mark.parametrize("model, name, field", FIELDS, ids=[f"{m}.{n}" for m, n, _ in FIELDS])
def test_every_field_has_a_docstring(model: str, name: str, field) -> None:
    assert (field.description or "").strip(), (
        f"{model}.{name} has no docstring: add a string literal right under the field in lattice/config/schema.py "
        "saying what it does (units, and why where it matters)")


def test_type_and_default_rendering() -> None:
    assert type_name(Source.model_fields["format"].annotation) == "one of `csv`, `tsv`, `parquet`, `jsonl`"
    assert type_name(Source.model_fields["domain"].annotation) == "string or [DomainFromColumn](#domainfromcolumn)"
    assert type_name(Source.model_fields["labels"].annotation) == "map of string to [LabelSpec](#labelspec)"
    assert yaml_inline(ModelSize(embedding_dim=32, head_dims=[128])) == "{embedding_dim: 32, head_dims: [128]}"
    assert yaml_inline({"cron": "@daily"}) == '{cron: "@daily"}'


def test_committed_page_is_current() -> None:
    assert PAGE.is_file(), f"{PAGE} is missing; run `lattice config reference --output docs/config-reference.md`"
    assert PAGE.read_text() == render_reference(), (
        "docs/config-reference.md is stale (the schema changed); run "
        "`lattice config reference --output docs/config-reference.md` and commit the page")
