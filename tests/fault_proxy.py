"""A fault-injection HTTP proxy on 127.0.0.1 in front of the S3 server of tests/s3_store.py.

Requests pass through unchanged unless a rule matches them (by method and object key, and
optionally only the Nth match); a rule can delay the request, answer 500, cut the body
short with the connection closed (`truncate`), answer with a smaller body of a matching
Content-Length (`short`), or hold the request until the test releases it (`hang`). Every
wait is bounded, and the proxy stops with the test (`fault_proxy` is a context manager).

    with s3_server(monkeypatch) as store, fault_proxy(store, monkeypatch) as proxy:
        rule = proxy.add("PUT", "plans/*.tmp-*", "hang")
        ...   # AWS_ENDPOINT_URL now points at the proxy
        rule.wait_hit()   # a matching request is being held
        rule.release()

A plain module (tests/conftest.py puts tests/ on sys.path): `from fault_proxy import ...`.
"""

from __future__ import annotations

import fnmatch
import http.client
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ACTIONS = ("delay", "fail", "truncate", "short", "hang")
WAIT = 30.0  # the longest any wait of the proxy or of a test on it lasts
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}

FAIL_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
    b"<Message>injected by the fault proxy</Message></Error>"
)


@dataclass
class Rule:
    """One fault: requests of `method` whose key matches the glob `key` (after the bucket;
    `*` crosses "/") get `action`. `nth`: only the Nth matching request (1-based), else
    every one, at most `times` of them. `seconds`: the delay of "delay", the longest hold of
    "hang". `keep`: bytes of the body that "truncate" and "short" send."""

    method: str
    key: str
    action: str
    nth: int | None = None
    times: int | None = None
    seconds: float = 1.0
    keep: int = 0
    matched: int = 0  # matching requests seen
    applied: int = 0  # of them, those the fault was applied to
    hit: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def matches(self, method: str, key: str) -> bool:
        return method == self.method and fnmatch.fnmatchcase(key, self.key)

    def take(self) -> bool:
        """Count one matching request; whether the fault applies to it."""
        self.matched += 1
        if self.nth is not None and self.matched != self.nth:
            return False
        if self.times is not None and self.applied >= self.times:
            return False
        self.applied += 1
        return True

    def wait_hit(self, timeout: float = WAIT) -> None:
        """Until a request got this fault (for "hang": is being held now)."""
        if not self.hit.wait(timeout):
            raise AssertionError(f"no {self.method} {self.key} request reached the proxy")

    def release(self) -> None:
        """Let held ("hang") requests go on to the server."""
        self.released.set()


class FaultProxy:
    """The running proxy: its endpoint, its rules and a log of (method, key, query, fault)."""

    def __init__(self, upstream: str):
        self.upstream = urllib.parse.urlsplit(upstream)
        self.rules: list[Rule] = []
        self.log: list[tuple[str, str, str, str]] = []
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, method: str, key: str, action: str, **options: Any) -> Rule:
        if action not in ACTIONS:
            raise ValueError(f"unknown fault {action!r}; one of {ACTIONS}")
        rule = Rule(method.upper(), key, action, **options)
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            for rule in self.rules:
                rule.release()
            self.rules.clear()

    def requests(self, method: str | None = None, key: str = "*") -> list[tuple[str, str, str]]:
        """(method, key, query) of the requests seen, optionally only matching ones."""
        with self._lock:
            return [
                (m, k, q)
                for m, k, q, _ in self.log
                if (method is None or m == method) and fnmatch.fnmatchcase(k, key)
            ]

    def _decide(self, method: str, key: str, query: str) -> Rule | None:
        with self._lock:
            chosen = None
            for rule in self.rules:
                if rule.matches(method, key) and rule.take() and chosen is None:
                    chosen = rule
            self.log.append((method, key, query, chosen.action if chosen else ""))
            return chosen


def _object_key(path: str) -> tuple[str, str]:
    """(key after the bucket, query) of a path-style request path."""
    parts = urllib.parse.urlsplit(path)
    _bucket, _, key = urllib.parse.unquote(parts.path).lstrip("/").partition("/")
    return key, parts.query


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = WAIT  # a client that stops mid-request does not hold a thread forever

        def log_message(self, *args: Any) -> None:
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = bytearray()
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return bytes(out)
                    out += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
            up = proxy.upstream
            conn = http.client.HTTPConnection(up.hostname, up.port, timeout=WAIT)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                headers.pop("Content-Length", None)
                headers.pop("Expect", None)
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                return resp.status, resp.reason, resp.getheaders(), data
            finally:
                conn.close()

        def _send(self, status: int, reason: str, headers, body: bytes, length: int) -> None:
            body_sent = self.command != "HEAD"
            self.send_response_only(status, reason)
            for k, v in headers:
                # a HEAD answer's Content-Length is the object's size: it goes as it is
                if k.lower() not in _HOP and (k.lower() != "content-length" or not body_sent):
                    self.send_header(k, v)
            if body_sent:
                self.send_header("Content-Length", str(length))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self.wfile.flush()

        def _serve(self) -> None:
            key, query = _object_key(self.path)
            rule = proxy._decide(self.command, key, query)
            action = rule.action if rule else ""
            if action == "truncate" and self.command in ("PUT", "POST"):
                # the server never gets the whole request, the client no answer
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(min(rule.keep, length))
                rule.hit.set()
                self._drop()
                return
            body = self._body()
            if rule:
                rule.hit.set()
            if action == "delay":
                time.sleep(rule.seconds)
            elif action == "hang":
                if not rule.released.wait(rule.seconds):
                    self._drop()
                    return
            elif action == "fail":
                self._send(
                    500,
                    "Internal Server Error",
                    [("Content-Type", "application/xml")],
                    FAIL_BODY,
                    len(FAIL_BODY),
                )
                return
            status, reason, headers, data = self._forward(body)
            if action == "truncate":  # the full length announced, part of it sent
                self._send(status, reason, headers, data[: rule.keep], len(data))
                self._drop()
            elif action == "short":  # a smaller body that says it is whole
                self._send(status, reason, headers, data[: rule.keep], len(data[: rule.keep]))
            else:
                self._send(status, reason, headers, data, len(data))

        def _drop(self) -> None:
            self.close_connection = True
            try:
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def do_GET(self) -> None:
            self._serve()

        do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    return Handler


@contextmanager
def fault_proxy(store: Any, monkeypatch: Any) -> Iterator[FaultProxy]:
    """A proxy in front of `store` (a running s3_store.Store), with AWS_ENDPOINT_URL
    pointing at it; held requests are released and the proxy stopped afterwards."""
    proxy = FaultProxy(store.endpoint)
    thread = threading.Thread(target=proxy.server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    try:
        yield proxy
    finally:
        proxy.clear()
        proxy.server.shutdown()
        proxy.server.server_close()
        thread.join(WAIT)
