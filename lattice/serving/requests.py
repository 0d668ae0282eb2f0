"""Request validation, driven by the platform config: which domains exist, which keys are
entities (looked up in the online store) and which features the caller sends at request time.

Shapes and types: the pydantic models document the API (OpenAPI) and write the error messages;
the msgspec structs below accept exactly the same bodies and decode a valid one about ten times
faster, so a valid request never goes through pydantic (see `app.parse_body`). `RequestSchema`
then checks the names against the config and raises `RequestError` with a message saying what
is wrong and what is allowed. Both become 422 responses; a body that cannot be read at all (not
UTF-8, nested too deeply) is a 400 and one over `serving.max_body_bytes` / `serving.max_batch`
a 413 (`RequestError.status`).

Ids are int64 (what the model hashes and the online store keys) and dense values are finite:
the wire structs bound every integer to int64, and msgspec refuses `NaN`, `Infinity` and
out-of-range numbers such as `1e999`; `RequestSchema.value_problem` applies both rules, with a
message naming the field, to a body that only the pydantic models accepted (Python's json reads
NaN and Infinity, and pydantic takes any int).
"""

from __future__ import annotations

from typing import Annotated, Union

import msgspec
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from lattice.config import PlatformConfig
from lattice.data import schema as S

SparseValue = Union[StrictInt, StrictStr]
DenseValue = Union[StrictFloat, StrictInt]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_INF = float("inf")
_NOT_INT64 = "does not fit a signed 64-bit integer (integers must be in [-2**63, 2**63 - 1]; send a larger id as a string)"

# an integer the fast decoder accepts: an int64 (a larger one fails over to the pydantic path,
# where `RequestSchema.value_problem` names it)
Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    domain: StrictStr
    entities: dict[str, SparseValue] = Field(description="entity key -> id, e.g. {\"user_id\": 42, \"ad_id\": 7}")
    features: dict[str, Union[SparseValue, StrictFloat, None]] = Field(
        default_factory=dict, description="request-time features by canonical column; absent = not logged for this request"
    )
    request_id: StrictStr | None = None
    passthrough: dict[str, SparseValue] = Field(
        default_factory=dict, description="the sources' pass-through keys (e.g. an impression id), logged with the "
                                          "prediction so that its label joins back to it")


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    requests: Annotated[list[PredictRequest], Field(min_length=1, description="at most `serving.max_batch` requests")]


class WireRequest(msgspec.Struct, forbid_unknown_fields=True):
    """`PredictRequest` for the fast decoder: same fields, same strictness (no bool for an int,
    no float for an id, no unknown field)."""

    domain: str
    entities: dict[str, Union[Int64, str]]
    features: dict[str, Union[Int64, str, float, None]] = {}
    request_id: Union[str, None] = None
    passthrough: dict[str, Union[Int64, str]] = {}


class WireBatch(msgspec.Struct, forbid_unknown_fields=True):
    requests: Annotated[list[WireRequest], msgspec.Meta(min_length=1)]  # at most schema.max_batch: parse_body


class Prediction(BaseModel):
    request_id: str | None = None
    domain: str
    probabilities: dict[str, float]
    unknown_entities: list[str] = Field(default_factory=list, description="entity keys not in the online store (defaults used)")


class PredictResponse(BaseModel):
    model_version: int
    predictions: list[Prediction]


class RequestError(ValueError):
    """An invalid request; the message says what is wrong and what is allowed. `status` is the
    HTTP answer: 422 (default) for a readable body with wrong content, 400 for a body that cannot
    be read at all, 413 for one over a limit."""

    def __init__(self, index: int | None, message: str, status: int = 422):
        self.index = index
        self.status = status
        super().__init__(message if index is None else f"requests[{index}]: {message}")


def short(value, limit: int = 80) -> str:
    """`repr(value)` cut to `limit` characters: an error message never echoes a whole body back."""
    r = repr(value)
    return r if len(r) <= limit else r[:limit] + f"... ({len(r)} characters)"


def dense_bounds(config: PlatformConfig) -> dict[str, tuple[float | None, float | None, float | None]]:
    """Dense column -> (exclusive low, low, high) as the feature stage checks it: a `log1p`
    feature needs a value above -1, and `valid_range` bounds it (both ends inclusive)."""
    out = {}
    for f in config.features.dense:
        above = -1.0 if f.transform == "log1p" else None
        lo, hi = f.valid_range or (None, None)
        if above is not None or lo is not None or hi is not None:
            out[f.column] = (above, lo, hi)
    return out


def _bound_problem(name: str, value: float, bounds: tuple[float | None, float | None, float | None]) -> str | None:
    above, lo, hi = bounds
    if not -_INF < value < _INF:
        return None  # NaN and infinities: `value_problem` says "must be a finite number"
    if above is not None and value <= above:
        return (f"features.{name}: {value!r} is out of range (log1p needs a value > {above:g}); the feature stage "
                f"quarantines such rows as value_out_of_range")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        return (f"features.{name}: {value!r} is outside its valid range {[lo, hi]} (features.dense valid_range); "
                f"the feature stage quarantines such rows as value_out_of_range")
    return None


class RequestSchema:
    """What a request may contain under one platform config."""

    def __init__(self, config: PlatformConfig):
        self.domains = config.domain_names
        self.entity_keys = [f.column for f in config.entity_features]
        self.sparse = [c for c in S.sparse_columns(config) if c not in self.entity_keys]
        self.dense = S.dense_columns(config)
        self._domains, self._entities = frozenset(self.domains), frozenset(self.entity_keys)
        self._sparse, self._dense = frozenset(self.sparse), frozenset(self.dense)
        self.max_batch = config.serving.max_batch
        self.passthrough = S.passthrough_columns(config)
        self._passthrough = frozenset(self.passthrough)
        # exact-id tables (hashing none): the feature stage quarantines an id outside the table,
        # so serving refuses one too instead of wrapping it onto another id's row
        self._exact = {f.column: f.num_embeddings for f in config.features.sparse if f.hashing == "none"}
        # the feature stage's value rules (pipelines/ingest.py quarantines a row breaking one as
        # value_out_of_range or null_key): serving refuses such a request, naming the field
        self._bounds = dense_bounds(config)

    def problem(self, req) -> str | None:
        """What is wrong with one request under this config, or None. The only copy of the rules
        (with `value_problem`, the value rules the wire structs apply while decoding): a valid
        request costs one pass of set lookups, and a message is built only for an invalid one."""
        if req.domain not in self._domains:
            return f"unknown domain {short(req.domain)}; use one of {self.domains}"
        if req.entities.keys() != self._entities:
            missing = [k for k in self.entity_keys if k not in req.entities]
            if missing:
                return f"missing entity key(s) {missing}; every request needs {self.entity_keys}"
            return f"unknown entity key(s) {short(sorted(set(req.entities) - self._entities), 200)}; entity keys are {self.entity_keys}"
        for name, value in req.entities.items():
            if type(value) is str and (S.is_null_like(value) or value.lstrip()[:1] in ("[", "{")):
                return (f"entities.{name}: {short(value, 40)} is not an id (empty, a spelling of null, or not one "
                        f"value); the feature stage quarantines such rows as null_key")
        for name, value in req.features.items():
            if name in self._sparse:
                if type(value) is float:
                    return f"feature {name!r} is categorical: send an integer or a string, got {value!r}"
                if name in self._exact and type(value) is int and not 0 <= value < self._exact[name]:
                    return f"feature {name!r} takes ids 0..{self._exact[name] - 1} (hashing none), got {short(value, 40)}"
            elif name in self._dense:
                if type(value) is str:
                    return f"feature {name!r} is numeric: send a number, got the string {short(value)}"
                if value is not None and name in self._bounds and (p := _bound_problem(name, value, self._bounds[name])):
                    return p
            elif name in self._entities:
                return f"{short(name)} is an entity key; send it under 'entities', not 'features'"
            else:
                return f"unknown feature {short(name)}; request-time features are {self.sparse + self.dense}"
        if req.passthrough and not req.passthrough.keys() <= self._passthrough:
            extra = sorted(set(req.passthrough) - self._passthrough)
            return (f"unknown pass-through key(s) {short(extra, 200)}; the sources' pass-through columns are "
                    f"{self.passthrough}")
        return None

    def value_problem(self, req) -> str | None:
        """What the wire structs refuse by decoding, for a request that did not come through them
        (the pydantic models take any Python int and float): an integer outside int64 (an id is
        hashed and looked up as an int64; larger ids can be sent as strings) and a dense value
        that is NaN or infinite (Python's json reads `NaN`, `Infinity` and `1e999`; msgspec
        refuses them, so a wire request needs no such pass). Run after `problem`, so every name
        here is one the config knows."""
        for name, value in req.entities.items():
            if type(value) is int and not INT64_MIN <= value <= INT64_MAX:
                return f"entities.{name}: {short(value, 40)} {_NOT_INT64}"
        for name, value in req.features.items():
            kind = type(value)
            if kind is int and not INT64_MIN <= value <= INT64_MAX:
                return f"features.{name}: {short(value, 40)} {_NOT_INT64}"
            if kind is float and name in self._dense and not -_INF < value < _INF:  # NaN fails both
                return f"feature {name!r} must be a finite number, got {value!r}"
        return None

    def check_all(self, reqs: list, batch: bool, values: bool = False, start: int = 0) -> None:
        """Raises RequestError for the first invalid request (indexed when the body is a batch).
        `values`: also apply `value_problem` (requests that did not come through the wire structs).
        `start`: the index of `reqs[0]` in the batch (a batch checked in pieces)."""
        problem = self.problem
        for i, r in enumerate(reqs, start):
            p = problem(r) or (self.value_problem(r) if values else None)
            if p is not None:
                raise RequestError(i if batch else None, p)

    def check(self, req: PredictRequest, index: int | None = None) -> None:
        p = self.problem(req) or self.value_problem(req)
        if p is not None:
            raise RequestError(index, p)
