"""Fairness between clients (issue 37 finding 7): one client sending large batches over several
connections must not starve the others.

- `ClientLimiter`: per client (its address; one shared token does not tell clients apart),
  requests and rows in flight are bounded; one over is refused 429 with `Retry-After`, before
  it costs anything.
- `FairScheduler`: parsing a body and scoring run on the event loop, scoring in chunks
  (`serving.limits.score_chunk_rows`); each is a turn, granted by start-time fair queuing over
  the time each client's turns take (measured: a row's cost differs between a lone request and
  a batch): a client's next turn is tagged max(its last finish, the virtual time) and the
  smallest tag goes first. Clients that are all busy get equal shares of the scoring time; a
  client that sends single requests is served before the next chunk of one that has been
  sending big batches, and waits for at most the turn in progress.
- `BodyTimeout`: ASGI middleware bounding how long a request body may take to arrive (408).
"""

from __future__ import annotations

import asyncio
import heapq
from contextlib import asynccontextmanager
import itertools
import time
from dataclasses import dataclass, field

from lattice.config.serving_limits import ClientLimits


class Refused(Exception):
    """A request over a client's limit: answered 429 with Retry-After."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


def client_key(scope: dict) -> str:
    client = scope.get("client")
    return client[0] if client else "-"


@dataclass
class _Usage:
    requests: int = 0
    rows: int = 0


@dataclass
class Ticket:
    """One admitted request: `rows(n)` admits its rows; `release()` gives everything back."""

    limiter: "ClientLimiter"
    client: str
    held_rows: int = 0
    released: bool = field(default=False)

    def rows(self, n: int) -> None:
        self.limiter._admit_rows(self, n)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.limiter._release(self)


class ClientLimiter:
    """Per-client counters on one event loop (no locks: every call runs on the loop)."""

    def __init__(self, limits: ClientLimits, max_batch: int):
        self.limits = limits
        self.max_rows = max(limits.max_rows_in_flight, max_batch)
        self._usage: dict[str, _Usage] = {}
        self.refused = 0

    def admit(self, client: str) -> Ticket:
        u = self._usage.setdefault(client, _Usage())
        if u.requests >= self.limits.max_requests_in_flight:
            self.refused += 1
            raise Refused(f"client {client} already has {u.requests} requests in flight, the limit "
                          f"(serving.limits.max_requests_in_flight); retry after a response", self.limits.retry_after_seconds)
        u.requests += 1
        return Ticket(self, client)

    def _admit_rows(self, ticket: Ticket, n: int) -> None:
        u = self._usage[ticket.client]
        if u.rows + n > self.max_rows:
            self.refused += 1
            raise Refused(f"client {ticket.client} has {u.rows} rows in flight; {n} more would pass the limit of "
                          f"{self.max_rows} (serving.limits.max_rows_in_flight); retry after a response",
                          self.limits.retry_after_seconds)
        u.rows += n
        ticket.held_rows += n

    def _release(self, ticket: Ticket) -> None:
        u = self._usage.get(ticket.client)
        if u is None:
            return
        u.requests -= 1
        u.rows -= ticket.held_rows
        if u.requests <= 0:
            del self._usage[ticket.client]  # bounded by the clients with requests open

    def in_flight(self, client: str) -> tuple[int, int]:
        u = self._usage.get(client)
        return (u.requests, u.rows) if u else (0, 0)


class FairScheduler:
    """One turn on the event loop's scoring at a time, granted by smallest start tag, where tags
    count each client's measured time in its turns (see the module docstring).

        async with scheduler.turn(client):
            ...  # synchronous work: parsing a body, scoring a chunk
    """

    def __init__(self):
        self._busy = False
        self._waiting: list[tuple[float, int, asyncio.Future]] = []
        self._seq = itertools.count()
        self._vtime = 0.0
        self._finish: dict[str, float] = {}
        self._cost: dict[str, float] = {}  # a client's recent time per turn (s): its next turn's estimate
        self._last: str | None = None  # the client whose turn ran last

    # Work in a turn never yields to the loop, so a request that arrived meanwhile has not yet
    # reached `turn` when it ends. The client that just ran lets the loop turn over a few times
    # first: enough for a request whose bytes are in (parse, admit, read the body) to queue, and
    # it costs a client alone a few microseconds per turn.
    YIELDS = 8

    @asynccontextmanager
    async def turn(self, client: str):
        estimate = await self._acquire(client)
        started = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - started
            # the tag was advanced by the estimate; correct it by what the turn really took
            self._finish[client] = self._finish.get(client, self._vtime) + took - estimate
            self._cost[client] = 0.8 * self._cost.get(client, took) + 0.2 * took
            self._release()

    async def _acquire(self, client: str) -> float:
        if client == self._last and not self._busy and not self._waiting:
            for _ in range(self.YIELDS):
                await asyncio.sleep(0)
                if self._busy or self._waiting:
                    break
        estimate = self._cost.get(client, 0.0)
        start = max(self._finish.get(client, 0.0), self._vtime)
        self._finish[client] = start + estimate
        if not self._busy and not self._waiting:
            self._busy, self._vtime, self._last = True, start, client
            return estimate
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (start, next(self._seq), fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release()  # the turn was handed to this request as it was cancelled: pass it on
            raise
        self._vtime, self._last = start, client
        return estimate

    def _release(self) -> None:
        while self._waiting:
            _, _, fut = heapq.heappop(self._waiting)
            if not fut.done():
                fut.set_result(None)  # busy stays True: the turn passes to that request
                return
        self._busy = False
        if len(self._finish) > 4096:  # forget clients whose tags the virtual time has passed
            self._finish = {c: f for c, f in self._finish.items() if f > self._vtime}
            self._cost = {c: v for c, v in self._cost.items() if c in self._finish}


class BodyTimeout:
    """ASGI middleware: a request body must arrive within `seconds` of the app asking for it;
    a slower one is answered 408 and the connection closed, so a slow-body client holds no
    request slot or memory for long."""

    def __init__(self, app, seconds: float):
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        deadline: float | None = None
        started = False

        async def bounded_receive():
            nonlocal deadline
            if deadline is None:
                deadline = time.monotonic() + self.seconds
            try:
                # asyncio.timeout, not wait_for: no task per chunk, so no extra loop turns
                async with asyncio.timeout(max(deadline - time.monotonic(), 0.001)):
                    return await receive()
            except TimeoutError:
                raise BodyTooSlow(f"request body not received within {self.seconds:g} s "
                                  "(serving.limits.body_timeout_seconds)") from None

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, bounded_receive, tracking_send)
        except BodyTooSlow as exc:  # the route answers it itself; this is for any other route
            if started:
                raise
            response = body_timeout_response(str(exc))
            await response(scope, receive, send)


class BodyTooSlow(Exception):
    """The body did not arrive in time (see `BodyTimeout`)."""


def body_timeout_response(message: str):
    from fastapi.responses import JSONResponse

    # Connection: close: the rest of a slow body is never waited for on this connection
    return JSONResponse(status_code=408, content={"detail": message}, headers={"Connection": "close"})
