"""Issue 37 finding 7: a connection that sends its request headers slowly is closed after
`serving.limits.header_timeout_seconds` (uvicorn itself would hold it for as long as the client
likes); a complete request on it is answered, and the wait for the next one's headers is bounded
again."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import uvicorn

from lattice.serving.header_timeout import HEADER_TIMEOUT_ENV, IMPORT_STRING


async def _app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    sock.settimeout(seconds)
    started = time.monotonic()
    try:
        data = sock.recv(1024)
    except socket.timeout:
        return None
    return time.monotonic() - started if data == b"" else None


@pytest.mark.slow
def test_slow_headers_are_cut_off(monkeypatch):
    monkeypatch.setenv(HEADER_TIMEOUT_ENV, "0.5")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(_app, host="127.0.0.1", port=port, http=IMPORT_STRING, log_level="warning",
                                           timeout_keep_alive=30, lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.time() + 10
        while not server.started and time.time() < deadline:
            time.sleep(0.05)
        slow = socket.create_connection(("127.0.0.1", port))
        slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        took = _closed_within(slow, 3.0)
        assert took is not None and took < 1.5, took

        kept = socket.create_connection(("127.0.0.1", port))
        kept.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        kept.settimeout(3)
        assert kept.recv(1024).startswith(b"HTTP/1.1 200")
        kept.sendall(b"GET / HT")  # the next request's headers, slowly: cut off too (keep-alive is 30 s)
        took = _closed_within(kept, 3.0)
        assert took is not None and took < 1.5, took
    finally:
        server.should_exit = True
        thread.join(timeout=10)
