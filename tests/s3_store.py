"""A real S3-protocol server for the object storage tests: moto's standalone server on
127.0.0.1, with the environment a job would have (AWS_* variables, AWS_ENDPOINT_URL) and
short timeouts, so a failure is quick. Tests skip only when moto is not installed.

A plain module (tests/conftest.py puts tests/ on sys.path): `from s3_store import ...`.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

BUCKET = "mds-test"
ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "MDS_S3_TIMEOUT": "3",
    "MDS_S3_ATTEMPTS": "2",
}


class Store:
    """The running server: its endpoint, a boto3 client and helpers to put objects."""

    def __init__(self, endpoint: str):
        import boto3

        self.endpoint = endpoint
        self.client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def url(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}"

    def upload(self, directory: Path, prefix: str) -> str:
        """Every file under `directory` as objects under `prefix`; returns the prefix URL."""
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                key = f"{prefix}/{path.relative_to(directory).as_posix()}"
                self.client.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes())
        return self.url(prefix)

    def put(self, key: str, body: bytes) -> None:
        self.client.put_object(Bucket=BUCKET, Key=key, Body=body)

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=BUCKET, Key=key)["Body"].read()

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=BUCKET, Key=key)

    def empty(self) -> None:
        """Remove every object of the bucket."""
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
            for item in page.get("Contents", []):
                self.client.delete_object(Bucket=BUCKET, Key=item["Key"])


def _atomic_preconditions(monkeypatch: Any) -> None:
    """Make moto's conditional PutObject and DeleteObject atomic, as S3's are: moto checks
    If-Match / If-None-Match and then writes without a lock, so two racing requests could
    both pass. Requests that carry a condition are served one at a time."""
    from moto.s3.responses import S3Response

    mutex = threading.Lock()
    for name in ("put_object", "delete_object"):
        original = getattr(S3Response, name)

        def serial(self, *args, _original=original, **kwargs):
            if "If-Match" in self.headers or "If-None-Match" in self.headers:
                with mutex:
                    return _original(self, *args, **kwargs)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(S3Response, name, serial)


@contextmanager
def s3_server(monkeypatch: Any) -> Iterator[Store]:
    """Start the server, point the environment at it, create the bucket (empty: moto keeps
    its objects in this process across servers); stop it after."""
    server_module = pytest.importorskip("moto.server")
    _atomic_preconditions(monkeypatch)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        for key, value in {**ENV, "AWS_ENDPOINT_URL": endpoint}.items():
            monkeypatch.setenv(key, value)
        store = Store(endpoint)
        store.client.create_bucket(Bucket=BUCKET)
        store.empty()
        yield store
    finally:
        server.stop()


@contextmanager
def silent_server() -> Iterator[str]:
    """An endpoint that accepts connections and never answers: a server that hangs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def free_port() -> int:
    """A port nothing listens on (bound, then released): a server that is down."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
