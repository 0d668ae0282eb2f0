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

    def _plainly_valid(self, req) -> bool:
        """The common case in one pass of set lookups; anything else goes to `check` for its message."""
        if req.domain not in self._domains or req.entities.keys() != self._entities:
            return False
        for name, value in req.features.items():
            if name in self._sparse:
                if type(value) is float:
                    return False
            elif name not in self._dense or type(value) is str:
                return False
        return True

    def check_all(self, reqs: list, batch: bool) -> None:
        for i, r in enumerate(reqs):
            if not self._plainly_valid(r):
                self.check(r, i if batch else None)

    def check(self, req: PredictRequest, index: int | None = None) -> None:
        if req.domain not in self.domains:
            raise RequestError(index, f"unknown domain {req.domain!r}; use one of {self.domains}")
        missing = [k for k in self.entity_keys if k not in req.entities]
        if missing:
            raise RequestError(index, f"missing entity key(s) {missing}; every request needs {self.entity_keys}")
        extra = sorted(set(req.entities) - set(self.entity_keys))
        if extra:
            raise RequestError(index, f"unknown entity key(s) {extra}; entity keys are {self.entity_keys}")
        for name, value in req.features.items():
            if name in self.entity_keys:
                raise RequestError(index, f"{name!r} is an entity key; send it under 'entities', not 'features'")
            if name in self.sparse:
                if isinstance(value, float):
                    raise RequestError(index, f"feature {name!r} is categorical: send an integer or a string, got {value!r}")
            elif name in self.dense:
                if isinstance(value, str):
                    raise RequestError(index, f"feature {name!r} is numeric: send a number, got the string {value!r}")
            else:
                raise RequestError(index, f"unknown feature {name!r}; request-time features are {self.sparse + self.dense}")
