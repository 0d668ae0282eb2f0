"""Issue 37 finding 10: serving refuses (422, naming the field) what the feature stage quarantines:
a log1p feature at -1 or below, an empty or null-like entity id."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from test_serving_hardening import GOOD, _app, base_config  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def client(base_config):  # noqa: F811
    with TestClient(_app(base_config)) as c:
        yield c


def _post(client, **change):
    body = json.loads(json.dumps(GOOD))
    for key, value in change.items():
        part, name = key.split("__")
        body[part][name] = value
    return client.post("/predict", json=body)


@pytest.mark.parametrize("change, field, reason", [
    ({"features__price": -5.0}, "features.price", "value_out_of_range"),
    ({"features__price": -1}, "features.price", "value_out_of_range"),
    ({"entities__user_id": ""}, "entities.user_id", "null_key"),
    ({"entities__user_id": " NULL "}, "entities.user_id", "null_key"),
    ({"entities__ad_id": "[1, 2]"}, "entities.ad_id", "null_key"),
])
def test_what_the_feature_stage_quarantines_is_a_422_naming_the_field(client, change, field, reason):
    resp = _post(client, **change)
    assert resp.status_code == 422, resp.text
    assert field in resp.json()["detail"] and reason in resp.json()["detail"]


def test_values_the_feature_stage_keeps_still_score(client):
    for change in ({"features__price": -0.5}, {"features__price": 0.0}, {"entities__user_id": "u-17"}):
        assert _post(client, **change).status_code == 200
