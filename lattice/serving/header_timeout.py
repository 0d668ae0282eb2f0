"""A bound on how long a client may take to send a request's headers (issue 37 finding 7).

uvicorn closes an idle keep-alive connection after `timeout_keep_alive`, but a connection that
has sent part of a request line or of its headers is held as long as the client likes. This
protocol (uvicorn's own, `http=` by import string so that every worker process loads it) arms a
timer whenever it waits for a request's headers (a new connection, or a response just sent) and
closes the connection when the headers have not all arrived within
`serving.limits.header_timeout_seconds` (read from `HEADER_TIMEOUT_ENV`, which `lattice serve`
sets). A request whose headers are in is bounded by the app's body timeout instead.
"""

from __future__ import annotations

import os

from uvicorn.protocols.http.auto import AutoHTTPProtocol

HEADER_TIMEOUT_ENV = "LATTICE_SERVING_HEADER_TIMEOUT"
IMPORT_STRING = "lattice.serving.header_timeout:HeaderTimeoutProtocol"


class HeaderTimeoutProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._lattice_seen_cycle = None
        self._lattice_header_timer = None
        self._lattice_arm()

    def _lattice_arm(self) -> None:
        self._lattice_disarm()
        seconds = float(os.environ.get(HEADER_TIMEOUT_ENV, "10"))
        self._lattice_header_timer = self.loop.call_later(seconds, self._lattice_too_slow)

    def _lattice_disarm(self) -> None:
        if getattr(self, "_lattice_header_timer", None) is not None:
            self._lattice_header_timer.cancel()
            self._lattice_header_timer = None

    def _lattice_too_slow(self) -> None:
        self._lattice_header_timer = None
        waiting = self.cycle is None or self.cycle is self._lattice_seen_cycle
        if waiting and not self.transport.is_closing():
            self.transport.close()  # headers incomplete: nothing was dispatched, nothing to answer

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.cycle is not None and self.cycle is not self._lattice_seen_cycle:
            self._lattice_seen_cycle = self.cycle  # a request's headers are in: the body timeout takes over
            self._lattice_disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._lattice_arm()  # waiting for the next request's headers (keep-alive bounds idleness)

    def connection_lost(self, exc) -> None:
        self._lattice_disarm()
        super().connection_lost(exc)
