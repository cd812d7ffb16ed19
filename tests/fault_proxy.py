"""A fault-injecting HTTP proxy on 127.0.0.1, for tests of object-store reads.

It forwards each request to an upstream server (moto's S3 server) and, for the first
``count`` requests whose method is in ``methods``, injects one fault instead of a clean
answer:

* ``"slowdown"``: a 503 SlowDown error, as S3 sends when throttling, without forwarding;
* ``"delay"``: the answer, after ``delay_s`` seconds of silence;
* ``"reset"``: the status line, the headers and half the body, then a TCP reset;
* ``"truncate"``: the status line, the headers (with the full Content-Length) and half
  the body, then a clean close;
* ``"short"``: a well-formed answer whose body (and Content-Length) is the first half of
  the real one: a server that lies, which no HTTP client can detect.

Bounded: it serves at most ``max_requests`` requests (then it answers 503 and forwards
nothing), and it stops by itself after ``lifetime_s`` seconds. Standard library only.
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

FAULTS = ("slowdown", "delay", "reset", "truncate", "short")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}
SLOWDOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class FaultProxy:
    """A proxy to ``upstream`` on 127.0.0.1 that injects ``fault`` into ``count`` answers.

    Use it as a context manager; ``url`` is its endpoint. ``faults_sent`` counts the
    faults injected so far, ``requests`` every request served.
    """

    def __init__(
        self,
        upstream: str,
        fault: str | None = None,
        count: int = 0,
        *,
        delay_s: float = 0.0,
        methods: tuple[str, ...] = ("GET",),
        max_requests: int = 5000,
        lifetime_s: float = 300.0,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.hostname != "127.0.0.1":
            raise ValueError(f"the upstream must be on 127.0.0.1, got {upstream!r}")
        self.upstream = (parts.hostname, parts.port or 80)
        self.methods = methods
        self.max_requests, self.lifetime_s = max_requests, lifetime_s
        self.requests = 0
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self.arm(fault, count, delay_s=delay_s)
        self._stop = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def arm(self, fault: str | None, count: int, *, delay_s: float | None = None) -> None:
        """From now on, inject ``fault`` into the next ``count`` requests (None: no faults)."""
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; use one of {FAULTS}")
        with self._lock:
            self.fault, self.count, self.faults_sent = fault, count, 0
            if delay_s is not None:
                self.delay_s = delay_s

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Stops serving (idempotent); a delayed answer in progress ends early."""
        self._stop.set()
        self._thread.join(timeout=10)
        self._server.server_close()
        with self._lock:  # kept-alive client connections end too
            for conn in self._connections:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._connections.clear()

    def _serve(self) -> None:
        timer = threading.Timer(self.lifetime_s, self._stop.set)
        timer.daemon = True
        timer.start()
        try:
            while not self._stop.is_set():
                self._server.timeout = 0.1
                self._server.handle_request()
        finally:
            timer.cancel()

    def next_action(self, method: str) -> str | None:
        """The fault to inject into this request (None: a clean answer); counts it."""
        with self._lock:
            self.requests += 1
            if self.requests > self.max_requests:
                return "over"
            if self.fault is None or method not in self.methods or self.faults_sent >= self.count:
                return None
            self.faults_sent += 1
            return self.fault

    def sleep(self, seconds: float) -> None:
        """Waits ``seconds``, or less if the proxy stops."""
        self._stop.wait(seconds)


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 30  # an idle client connection is closed after this

        def log_message(self, format, *args) -> None:  # quiet
            pass

        def setup(self) -> None:
            super().setup()
            with proxy._lock:
                proxy._connections.add(self.connection)

        def finish(self) -> None:
            with proxy._lock:
                proxy._connections.discard(self.connection)
            super().finish()

        def _handle(self) -> None:
            if proxy._stop.is_set():
                self.close_connection = True
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            action = proxy.next_action(self.command)
            if action in ("over", "slowdown"):
                return self._send_error(503, SLOWDOWN_BODY)
            if action == "delay":
                proxy.sleep(proxy.delay_s)
            status, reason, headers, payload = self._forward(body)
            if action == "short":
                payload = payload[: len(payload) // 2]
            self.send_response(status, reason)
            head = self.command == "HEAD"  # its Content-Length is the object's, as is
            for k, v in headers:
                if k.lower() not in HOP_BY_HOP and (head or k.lower() != "content-length"):
                    self.send_header(k, v)
            if not head:
                self.send_header("Content-Length", str(len(payload)))
            if action in ("reset", "truncate"):
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(payload[: len(payload) // 2])
                self.wfile.flush()
                if action == "reset":  # SO_LINGER 0: close() sends a RST
                    self.connection.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                self.close_connection = True
                return
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
            conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
                return resp.status, resp.reason, resp.getheaders(), payload
            finally:
                conn.close()

        def _send_error(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

    return Handler


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(fn) -> tuple[BaseException | None, float]:
    """``(the exception fn raised or None, seconds it took)``."""
    start = time.monotonic()
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - the test inspects it
        return e, time.monotonic() - start
    return None, time.monotonic() - start
