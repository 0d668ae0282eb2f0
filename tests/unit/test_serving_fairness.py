"""Issue 37 finding 7: per-client limits (429 with Retry-After), a body read timeout (408), and
fair turns between clients: a single request waits for at most one chunk of another client's
batch, not for the whole batch."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from lattice.config.serving_limits import ClientLimits
from lattice.serving.fairness import FairScheduler

from test_serving_hardening import GOOD, _app, base_config  # noqa: F401 (fixture)


def _limits(base_config, **kw):  # noqa: F811
    return base_config.serving.limits.model_copy(update=kw)


async def _slow_body(parts: list[bytes], pause: float):
    for p in parts:
        await asyncio.sleep(pause)
        yield p


def _run(app, coro_fn):
    async def main():
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
                return await coro_fn(c)
    return asyncio.run(main())


def test_a_client_over_its_requests_in_flight_gets_429_with_retry_after(base_config):  # noqa: F811
    app = _app(base_config, limits=_limits(base_config, max_requests_in_flight=1, body_timeout_seconds=5))
    body = json.dumps(GOOD).encode()

    async def go(c):
        held = asyncio.create_task(c.post("/predict", content=_slow_body([body[:10], body[10:]], 0.3),
                                          headers={"content-type": "application/json"}))
        await asyncio.sleep(0.1)  # the first request is admitted and still sending its body
        second = await c.post("/predict", json=GOOD)
        return second, await held

    second, first = _run(app, go)
    assert second.status_code == 429 and second.headers["retry-after"] == "1", second.text
    assert second.headers["connection"] == "close"  # its unread body is not left on the connection
    assert "max_requests_in_flight" in second.json()["detail"]
    assert first.status_code == 200  # the slot is given back: the held request completes


def test_a_slow_body_is_cut_off_with_408(base_config):  # noqa: F811
    app = _app(base_config, limits=_limits(base_config, body_timeout_seconds=0.2))
    body = json.dumps(GOOD).encode()

    async def go(c):
        started = time.monotonic()
        r = await c.post("/predict", content=_slow_body([body[:5], body[5:]], 1.0), headers={"content-type": "application/json"})
        return r, time.monotonic() - started

    resp, took = _run(app, go)
    assert resp.status_code == 408 and "body_timeout_seconds" in resp.json()["detail"], resp.text
    assert took < 1.5  # answered at the deadline, not after the whole slow body


def test_rows_in_flight_over_the_limit_get_429(base_config):  # noqa: F811
    from lattice.serving.fairness import ClientLimiter, Refused

    limiter = ClientLimiter(ClientLimits(max_rows_in_flight=100), max_batch=64)
    a, b = limiter.admit("10.0.0.1"), limiter.admit("10.0.0.1")
    a.rows(64)
    with pytest.raises(Refused, match="max_rows_in_flight") as err:
        b.rows(64)
    assert err.value.retry_after == 1
    limiter.admit("10.0.0.2").rows(64)  # another client is not charged for the first one's rows
    a.release()
    b.rows(64)  # room again
    assert limiter.in_flight("10.0.0.1") == (1, 64)


def test_a_single_request_waits_for_one_chunk_not_a_whole_batch():
    chunk_s, chunks = 0.01, 16  # an abusive batch: 16 chunks of 10 ms each

    async def main():
        sched = FairScheduler()
        waits = []

        async def abuser():
            for _ in range(3):  # one batch after another
                for _ in range(chunks):
                    async with sched.turn("abuser"):
                        time.sleep(chunk_s)  # scoring runs on the loop, blocking it like the real one

        async def normal():
            for _ in range(10):
                due = time.monotonic() + 0.013
                await asyncio.sleep(0.013)
                async with sched.turn("normal"):
                    waits.append(time.monotonic() - due)  # from when it was ready to run
                    time.sleep(0.001)

        await asyncio.gather(normal(), abuser())  # normal first: its clock starts before the batch
        return waits

    waits = asyncio.run(main())
    # at most the chunk being scored (plus scheduling noise on a busy machine), never the
    # 160 ms batch: FIFO order would put the normal request behind the rest of the batch
    assert max(waits) < 2.5 * chunk_s, waits


def test_a_big_batch_is_parsed_in_chunk_sized_turns_and_a_lone_request_takes_one(base_config, monkeypatch):  # noqa: F811
    """A 1,024-row body's request rules cost more than its decode: they run a chunk of rows per
    fair turn (so another client waits for one chunk's worth, not the whole parse), and the first
    invalid row is still the one named. A lone request is parsed without a turn of its own: it
    waits for one turn (its scoring), not two."""
    import lattice.serving.fairness as fairness

    turns: list[str] = []
    real = fairness.FairScheduler.turn

    def counted(self, client):
        turns.append(client)
        return real(self, client)

    monkeypatch.setattr(fairness.FairScheduler, "turn", counted)
    app = _app(base_config, max_batch=256, limits=_limits(base_config, score_chunk_rows=16))
    rows = [dict(GOOD, request_id=f"r{i}") for i in range(200)]
    bad = [*rows[:150], dict(GOOD, features={"device": 1, "price": -5.0}), *rows[151:]]

    async def go(c):
        single = await c.post("/predict", json=GOOD)
        n_single = len(turns)
        batch = await c.post("/predict", json={"requests": rows})
        n_batch = len(turns) - n_single
        refused = await c.post("/predict", json={"requests": bad})
        return single, n_single, batch, n_batch, refused

    single, n_single, batch, n_batch, refused = _run(app, go)
    assert single.status_code == 200 and n_single == 1
    assert batch.status_code == 200 and len(batch.json()["predictions"]) == 200
    assert n_batch == 1 + 13 + 13  # the decode, the rules 16 rows a turn, the scoring 16 rows a turn
    assert refused.status_code == 422 and refused.json()["detail"].startswith("requests[150]"), refused.text
