"""Request validation, driven by the platform config: which domains exist, which keys are
entities (looked up in the online store) and which features the caller sends at request time.

Shapes and types: the pydantic models document the API (OpenAPI) and write the error messages;
the msgspec structs below accept exactly the same bodies and decode a valid one about ten times
faster, so a valid request never goes through pydantic (see `app.parse_body`). `RequestSchema`
then checks the names against the config and raises `RequestError` with a message saying what
is wrong and what is allowed. Both become 422 responses.
"""

from __future__ import annotations

from typing import Annotated, Union

import msgspec
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from lattice.config import PlatformConfig
from lattice.data import schema as S

SparseValue = Union[StrictInt, StrictStr]
DenseValue = Union[StrictFloat, StrictInt]

MAX_BATCH = 4096


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    domain: StrictStr
    entities: dict[str, SparseValue] = Field(description="entity key -> id, e.g. {\"user_id\": 42, \"ad_id\": 7}")
    features: dict[str, Union[SparseValue, StrictFloat, None]] = Field(
        default_factory=dict, description="request-time features by canonical column; absent = not logged for this request"
    )
    request_id: StrictStr | None = None


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    requests: Annotated[list[PredictRequest], Field(min_length=1, max_length=MAX_BATCH)]


class WireRequest(msgspec.Struct, forbid_unknown_fields=True):
    """`PredictRequest` for the fast decoder: same fields, same strictness (no bool for an int,
    no float for an id, no unknown field)."""

    domain: str
    entities: dict[str, Union[int, str]]
    features: dict[str, Union[int, str, float, None]] = {}
    request_id: Union[str, None] = None


class WireBatch(msgspec.Struct, forbid_unknown_fields=True):
    requests: Annotated[list[WireRequest], msgspec.Meta(min_length=1, max_length=MAX_BATCH)]


class Prediction(BaseModel):
    request_id: str | None = None
    domain: str
    probabilities: dict[str, float]
    unknown_entities: list[str] = Field(default_factory=list, description="entity keys not in the online store (defaults used)")


class PredictResponse(BaseModel):
    model_version: int
    predictions: list[Prediction]


class RequestError(ValueError):
    """A semantically invalid request; the message says what is wrong and what is allowed."""

    def __init__(self, index: int | None, message: str):
        self.index = index
        super().__init__(message if index is None else f"requests[{index}]: {message}")


class RequestSchema:
    """What a request may contain under one platform config."""

    def __init__(self, config: PlatformConfig):
        self.domains = config.domain_names
        self.entity_keys = [f.column for f in config.entity_features]
        self.sparse = [c for c in S.sparse_columns(config) if c not in self.entity_keys]
        self.dense = S.dense_columns(config)
        self._domains, self._entities = frozenset(self.domains), frozenset(self.entity_keys)
        self._sparse, self._dense = frozenset(self.sparse), frozenset(self.dense)

    def problem(self, req) -> str | None:
        """What is wrong with one request under this config, or None. The only copy of the rules:
        a valid request costs one pass of set lookups, and a message is built only for an
        invalid one."""
        if req.domain not in self._domains:
            return f"unknown domain {req.domain!r}; use one of {self.domains}"
        if req.entities.keys() != self._entities:
            missing = [k for k in self.entity_keys if k not in req.entities]
            if missing:
                return f"missing entity key(s) {missing}; every request needs {self.entity_keys}"
            return f"unknown entity key(s) {sorted(set(req.entities) - self._entities)}; entity keys are {self.entity_keys}"
        for name, value in req.features.items():
            if name in self._sparse:
                if type(value) is float:
                    return f"feature {name!r} is categorical: send an integer or a string, got {value!r}"
            elif name in self._dense:
                if type(value) is str:
                    return f"feature {name!r} is numeric: send a number, got the string {value!r}"
            elif name in self._entities:
                return f"{name!r} is an entity key; send it under 'entities', not 'features'"
            else:
                return f"unknown feature {name!r}; request-time features are {self.sparse + self.dense}"
        return None

    def check_all(self, reqs: list, batch: bool) -> None:
        """Raises RequestError for the first invalid request (indexed when the body is a batch)."""
        problem = self.problem
        for i, r in enumerate(reqs):
            p = problem(r)
            if p is not None:
                raise RequestError(i if batch else None, p)

    def check(self, req: PredictRequest, index: int | None = None) -> None:
        p = self.problem(req)
        if p is not None:
            raise RequestError(index, p)
