"""The hand-written Redis reader serving used before redis-py (kept here only as the baseline
of bench/bench_redis_client.py): HMGETs as one prebuilt RESP buffer on a raw socket, replies
parsed in one pass. Field names through lattice.serving.feast_keys.field_key.
"""

from __future__ import annotations

import socket


from lattice.serving.feast_keys import encode_keys, field_key, key_template
from lattice.serving.redis_online import CircuitBreaker, OnlineStoreUnavailable, _fv_name, _numbers


def parse_connection_string(text: str) -> dict:
    """Feast's `host:port,password=...,db=N[,ssl=true]` -> host, port, password, db (strings kept
    as written: a password of digits stays a string)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    host, _, port = parts[0].partition(":")
    opts = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
    if opts.get("ssl", "false").lower() == "true" or opts.get("redis_type") not in (None, "redis"):
        raise ValueError("the fast Redis reader handles a single plain-TCP Redis; TLS and clusters read through Feast")
    return {"host": host or "localhost", "port": int(port or 6379), "password": opts.get("password"),
            "username": opts.get("username"), "db": int(opts.get("db", 0))}


def _command(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


class RedisOnlineReader:
    def __init__(self, repo_config, views: list, connect_timeout: float = 0.2, read_timeout: float = 0.5,
                 breaker: CircuitBreaker | None = None):
        store = repo_config.online_store
        kind = getattr(store, "redis_type", "redis")
        if getattr(kind, "value", kind) != "redis":
            raise ValueError(f"redis_type {kind}: the fast reader reads a single Redis (clusters read through Feast)")
        self.endpoint = parse_connection_string(store.connection_string)
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.breaker = breaker or CircuitBreaker()
        self._project = repo_config.project.encode()
        self._key_version = repo_config.entity_key_serialization_version
        self._templates: dict[str, tuple[bytes, bytes] | None] = {}
        # per view: the HMGET field list as the tail of a command (`*N $5 HMGET` + key + fields)
        self._fields: dict[str, tuple[int, bytes]] = {}
        for view in views:
            name = _fv_name(view, repo_config)
            hashed = [field_key(name, f.name) for f in view.features]
            self._fields[view.name] = (len(hashed), b"".join(b"$%d\r\n%s\r\n" % (len(h), h) for h in hashed))
        self._sock: socket.socket | None = None

    # ---- connection
    def _connect(self) -> socket.socket:
        ep = self.endpoint
        sock = socket.create_connection((ep["host"], ep["port"]), timeout=self.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.read_timeout)
        hello = []
        if ep["password"]:
            user = [ep["username"].encode()] if ep["username"] else []
            hello.append(_command(b"AUTH", *user, ep["password"].encode()))
        if ep["db"]:
            hello.append(_command(b"SELECT", str(ep["db"]).encode()))
        if hello:
            sock.sendall(b"".join(hello))
            buf = bytearray()
            for _ in hello:
                line = self._line(sock, buf)
                if not line.startswith(b"+"):
                    sock.close()  # the server's own message (never echoes the password)
                    raise ConnectionError(f"Redis refused the connection: {line.decode(errors='replace')[:200]}")
        return sock

    def _line(self, sock: socket.socket, buf: bytearray) -> bytes:
        while (end := buf.find(b"\r\n")) < 0:
            self._recv(sock, buf)
        line = bytes(buf[:end])
        del buf[:end + 2]
        return line

    @staticmethod
    def _recv(sock: socket.socket, buf: bytearray) -> None:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("Redis closed the connection")
        buf += chunk

    def _call(self, payload: bytes, parse):
        """Send `payload`, parse the reply; any network failure opens the breaker."""
        if not self.breaker.allow():
            raise OnlineStoreUnavailable(f"online store unavailable ({self.breaker.error}); retrying in a moment")
        try:
            if self._sock is None:
                self._sock = self._connect()
            self._sock.sendall(payload)
            out = parse(self._sock)
        except (OSError, ConnectionError, ValueError) as exc:  # refused, reset, timed out, a garbled reply
            self.close()
            self.breaker.failure(exc)
            raise OnlineStoreUnavailable(f"online store unavailable: {type(exc).__name__}: {exc}") from exc
        self.breaker.success()
        return out

    def ping(self) -> None:
        def parse(sock):
            line = self._line(sock, bytearray())
            if line != b"+PONG":
                raise ValueError(f"unexpected PING reply {line[:80]!r}")
        self._call(_command(b"PING"), parse)

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    # ---- reads
    def _keys(self, join_key: str, ids: list[int]) -> list[bytes]:
        if join_key not in self._templates:
            self._templates[join_key] = key_template(join_key, self._key_version)
        project = self._project
        return [k + project for k in encode_keys(join_key, ids, self._key_version, self._templates[join_key])]

    def read_many(self, wanted: list[tuple[str, str, list[str], list[int]]]) -> list[dict[int, np.ndarray]]:
        """[(view, join key, features, ids)] -> per item: id -> values in the view's feature order
        (all NaN for an entity the store lacks). Every view's reads go in one round trip."""
        parts, shape = [], []
        for view, key, feats, ids in wanted:
            nf, tail = self._fields[view]
            head = b"*%d\r\n$5\r\nHMGET\r\n" % (nf + 2)
            parts += [head + b"$%d\r\n%s\r\n" % (len(k), k) + tail for k in self._keys(key, ids)]
            shape.append((len(ids), nf))
        # a PING after the HMGETs: its +PONG, the last reply, says the whole answer has arrived
        count = sum(n for n, _ in shape)
        values = self._call(b"".join(parts) + _PING, lambda sock: _parse_arrays(sock, count, self._recv))
        numbers = _numbers(values)
        out, at = [], 0
        for (n, nf), (_, _, _, ids) in zip(shape, wanted):
            out.append(dict(zip(ids, numbers[at:at + n * nf].reshape(n, nf))))
            at += n * nf
        return out


_PING = b"*1\r\n$4\r\nPING\r\n"
_PONG = b"\r\n+PONG\r\n"
def _parse_arrays(sock: socket.socket, n: int, recv) -> list:
    """`n` RESP array replies of bulk strings, then +PONG -> their elements, flat (None for a
    nil). The reply is read whole and split on CRLF in C; a value that itself holds CRLF (a
    double's bytes may) is joined back from its pieces by its declared length."""
    buf = bytearray()
    while not buf.endswith(_PONG):
        recv(sock, buf)
    tokens = bytes(buf).split(b"\r\n")
    out: list = []
    append = out.append
    i = 0
    for _ in range(n):
        head = tokens[i]
        if head[:1] != b"*":  # '-' is an error reply (e.g. WRONGTYPE)
            raise ValueError(f"Redis answered {head[:200]!r} to HMGET")
        i += 1
        for _ in range(int(head[1:])):
            h = tokens[i]
            if h == b"$-1":
                append(None)
                i += 1
                continue
            size = int(h[1:])
            v = tokens[i + 1]
            i += 2
            while len(v) < size:
                v += b"\r\n" + tokens[i]
                i += 1
            append(v)
    if tokens[i] != b"+PONG" or i + 2 != len(tokens):
        raise ValueError("the Redis reply did not match the commands sent")
    return out
