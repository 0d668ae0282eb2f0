"""`serving.limits`: what one client may hold of a server at a time, so that one client cannot
starve the others (issue 37 finding 7)."""

from __future__ import annotations

from pydantic import Field

from lattice.config.strict import Strict


class ClientLimits(Strict):
    max_requests_in_flight: int = Field(default=16, ge=1)
    """Most `/predict` requests one client (its address) may have open at once; one more is
    answered 429 with `Retry-After` before its body is read."""
    max_rows_in_flight: int = Field(default=2048, ge=1)
    """Most request rows one client may have admitted and not yet answered (a batch of N counts
    N); a batch that would pass it is answered 429 with `Retry-After`. A value below `serving.max_batch`
    is raised to it, so that one largest batch always fits."""
    score_chunk_rows: int = Field(default=64, ge=1)
    """A batch is scored in chunks of this many rows, and between chunks the clients take turns
    by the scoring time each has used (start-time fair queuing): a client's single request waits
    for at most one chunk of another client's batch, never for the whole batch. Smaller chunks
    shorten that wait and cost the batch's sender more time per row (each model call has a fixed
    cost)."""
    body_timeout_seconds: float = Field(default=10.0, gt=0)
    """Longest time the server waits for a request body to arrive once its headers have; a
    slower body is answered 408 and its connection closed (a slow-body client holds nothing)."""
    header_timeout_seconds: float = Field(default=10.0, gt=0)
    """Longest time a connection may take to send a request's line and headers (a new connection,
    or the next request on a kept-alive one); then it is closed (a slow-header client holds
    nothing)."""
    keep_alive_seconds: float = Field(default=5.0, gt=0)
    """How long an idle keep-alive connection stays open between requests (uvicorn's
    `timeout_keep_alive`)."""
    retry_after_seconds: int = Field(default=1, ge=1)
    """The `Retry-After` a refused (429) request gets."""
