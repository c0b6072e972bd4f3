"""A GCS server for the object storage tests: gcp-storage-emulator on 127.0.0.1, in a
process of its own (pyarrow's GCS client holds the GIL while it opens an object, so a
server thread in the test process would never answer), with $STORAGE_EMULATOR_HOST
pointing at it and short timeouts. It is started through tests/gcs_emulator.py, which
makes it honour `ifGenerationMatch` preconditions as GCS does. Tests skip only when the
emulator is not installed.

A plain module (tests/conftest.py puts tests/ on sys.path): `from gcs_store import ...`.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

BUCKET = "mds-test"
ENV = {"MDS_S3_TIMEOUT": "1", "MDS_S3_ATTEMPTS": "2"}


class Store:
    """The running emulator: its endpoint and helpers to put, get and delete objects."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint

    def url(self, prefix: str) -> str:
        return f"gs://{BUCKET}/{prefix}"

    def _object(self, key: str) -> str:
        return f"{self.endpoint}/storage/v1/b/{BUCKET}/o/{urllib.request.quote(key, safe='')}"

    def put(self, key: str, body: bytes) -> None:
        name = urllib.request.quote(key, safe="")
        request = urllib.request.Request(
            f"{self.endpoint}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={name}",
            data=body,
            method="POST",
        )
        urllib.request.urlopen(request).read()

    def get(self, key: str) -> bytes:
        return urllib.request.urlopen(self._object(key) + "?alt=media").read()

    def delete(self, key: str) -> None:
        urllib.request.urlopen(urllib.request.Request(self._object(key), method="DELETE")).read()

    def keys(self, prefix: str) -> list[str]:
        query = urllib.request.quote(prefix, safe="")
        listed = json.loads(
            urllib.request.urlopen(f"{self.endpoint}/storage/v1/b/{BUCKET}/o?prefix={query}").read()
        )
        return sorted(item["name"] for item in listed.get("items", []))

    def upload(self, directory: Path, prefix: str) -> str:
        """Every file under `directory` as objects under `prefix`; returns the prefix URL."""
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                self.put(f"{prefix}/{path.relative_to(directory).as_posix()}", path.read_bytes())
        return self.url(prefix)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def gcs_server(monkeypatch: Any) -> Iterator[Store]:
    """Start the emulator, point the environment at it, create the bucket; stop it after."""
    if importlib.util.find_spec("gcp_storage_emulator") is None:
        pytest.skip("gcp-storage-emulator is not installed")
    port = _free_port()
    wrapper = str(Path(__file__).with_name("gcs_emulator.py"))
    command = [sys.executable, wrapper, "start", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--in-memory", "--default-bucket", BUCKET]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the GCS emulator did not start") from None
                time.sleep(0.1)
        endpoint = f"http://127.0.0.1:{port}"
        for key, value in {**ENV, "STORAGE_EMULATOR_HOST": endpoint}.items():
            monkeypatch.setenv(key, value)
        yield Store(endpoint)
    finally:
        server.terminate()
        server.wait(timeout=30)
