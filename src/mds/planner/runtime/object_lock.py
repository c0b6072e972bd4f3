"""One writer at a time for an index or plan in object storage: a lock object beside it.

For the output `s3://b/p/idx` the lock is `s3://b/p/.idx.lock` (never under an index's
prefix, so never taken for data nor removed by an index's cleanup), created with a
conditional request that fails if it exists (S3 `If-None-Match: *`, GCS
`ifGenerationMatch=0`). It holds the writer's pid, host, start time and a random token.
The holder renews it every TTL/4 (a conditional overwrite of its own version), so a lock
is stale when its holder's host is this host and its pid is dead, or when it was not
renewed for MDS_LOCK_TTL seconds (default 600; the age is measured on the store's clock:
the response's Date minus the object's modification time). A stale lock is taken over
with a conditional overwrite of the version that was judged stale (S3 `If-Match: ETAG`,
GCS `ifGenerationMatch=GENERATION`), so of two writers taking it over only one wins; it
is released by a delete conditional on our own version.

pyarrow's filesystems cannot send conditional requests, so writers use boto3 for S3 (the
`s3` extra) and Google's JSON API through google-auth for GCS (the `gcs` extra); reading
needs neither.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote

from mds.core import storage
from mds.errors import ConfigError, OutputError, install_hint
from mds.planner.runtime.atomic import pid_alive, same_machine
from mds.planner.runtime.lock_record import held_by, lock_name, lock_record, parse_record
from mds.planner.runtime.upload import s3_client

__all__ = ["TTL_ENV", "ObjectLock", "lock_url", "object_lock"]

TTL_ENV = "MDS_LOCK_TTL"
DEFAULT_TTL = 600.0
_TRIES = 10


def lock_url(url: str) -> str:
    """The lock object of the output `url`: `.NAME.lock` beside it (see src/mds/planner/runtime/lock.py for
    names too long), or `.mds.lock` at the top of a bucket that is the output."""
    url = url.rstrip("/")
    scheme, rest = url.split("://", 1)
    bucket, _, key = rest.partition("/")
    if not key:
        return f"{scheme}://{bucket}/.mds.lock"
    parent, _, name = key.rpartition("/")
    return f"{scheme}://{bucket}/{parent + '/' if parent else ''}{lock_name(name)}"


def _ttl() -> float:
    return storage.env_number(TTL_ENV, DEFAULT_TTL, float)


def _age(header_date: str | None, modified: Any) -> float:
    """Seconds since `modified` by the server's clock (its Date header), else ours."""
    if isinstance(modified, str):
        from datetime import datetime

        modified = datetime.fromisoformat(modified.replace("Z", "+00:00"))
    now = None
    if header_date:
        try:
            now = parsedate_to_datetime(header_date).timestamp()
        except (TypeError, ValueError):
            now = None
    return (now if now is not None else time.time()) - modified.timestamp()


def _needs(url: str, package: str, extra: str) -> ConfigError:
    return ConfigError(
        f"writing to {url} needs {package} for its lock (a conditional request pyarrow "
        f"cannot send): {install_hint(extra)}"
    )


class _S3:
    """Conditional create, read, overwrite and delete of one S3 object, through boto3."""

    def __init__(self, url: str):
        try:
            import boto3  # noqa: F401
        except ImportError:
            raise _needs(url, "boto3", "s3") from None
        bucket_key = url.split("://", 1)[1]
        self.bucket, _, self.key = bucket_key.partition("/")
        self.client = s3_client()

    @staticmethod
    def _code(exc: Any) -> str:
        return str(exc.response.get("Error", {}).get("Code", ""))

    def _lost(self, exc: Any) -> bool:
        """A precondition that failed: another writer's version is there (or none is)."""
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = self._code(exc)
        return status in (404, 409, 412) or code in (
            "PreconditionFailed",
            "ConditionalRequestConflict",
            "NoSuchKey",
        )

    def _put(self, body: bytes, **condition: str) -> str | None:
        from botocore.exceptions import ClientError

        try:
            answer = self.client.put_object(
                Bucket=self.bucket, Key=self.key, Body=body, **condition
            )
        except ClientError as exc:
            if self._lost(exc):
                return None
            raise
        return str(answer["ETag"])

    def create(self, body: bytes) -> str | None:
        return self._put(body, IfNoneMatch="*")

    def replace(self, body: bytes, tag: str) -> str | None:
        return self._put(body, IfMatch=tag)

    def read(self) -> tuple[bytes, str, float] | None:
        from botocore.exceptions import ClientError

        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except ClientError as exc:
            if self._code(exc) in ("NoSuchKey", "404"):
                return None
            raise
        body = answer["Body"].read()
        date = answer.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        return body, str(answer["ETag"]), _age(date, answer["LastModified"])

    def delete(self, tag: str) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=tag)
        except ClientError as exc:
            if self._lost(exc):
                return  # not ours any more (or gone): leave it
            if self._code(exc) not in ("NotImplemented", "InvalidArgument"):
                raise
            # a store without conditional deletes: delete if it is still our version
            current = self.read()
            if current is not None and current[1] == tag:
                self.client.delete_object(Bucket=self.bucket, Key=self.key)


class _GCS:
    """The same for a GCS object, through the JSON API: `ifGenerationMatch` preconditions.
    Credentials from google-auth's default chain, or none for the emulator that
    $STORAGE_EMULATOR_HOST names."""

    def __init__(self, url: str):
        try:
            import google.auth
            import google.auth.exceptions
            import requests
            from google.auth.transport.requests import AuthorizedSession
        except ImportError:
            raise _needs(url, "google-auth", "gcs") from None
        bucket_key = url.split("://", 1)[1]
        self.bucket, _, self.key = bucket_key.partition("/")
        self.timeout = storage.request_timeout()
        self.tries = storage.attempts()
        emulator = os.environ.get(storage.GCS_EMULATOR_ENV, "").strip()
        if emulator:
            self.base = (emulator if "://" in emulator else f"http://{emulator}").rstrip("/")
            self.session = requests.Session()
        else:
            scope = "https://www.googleapis.com/auth/devstorage.read_write"
            try:
                credentials, _ = google.auth.default(scopes=[scope])
            except google.auth.exceptions.DefaultCredentialsError as exc:
                raise ConfigError(f"writing to {url}: no Google credentials ({exc})") from None
            self.base = "https://storage.googleapis.com"
            self.session = AuthorizedSession(credentials)
        self.object = f"{self.base}/storage/v1/b/{self.bucket}/o/{quote(self.key, safe='')}"

    def _request(self, method: str, url: str, **kwargs: Any) -> Any:
        """One request, retried on connection failures and 429/5xx answers."""
        import requests

        for attempt in range(self.tries):
            try:
                answer = self.session.request(method, url, timeout=self.timeout, **kwargs)
            except requests.RequestException:
                if attempt + 1 == self.tries:
                    raise
            else:
                if answer.status_code != 429 and answer.status_code < 500:
                    return answer
                if attempt + 1 == self.tries:
                    answer.raise_for_status()
            time.sleep(min(2.0, 0.1 * 2**attempt))
        raise AssertionError("unreachable")

    def _put(self, body: bytes, generation: str) -> str | None:
        url = f"{self.base}/upload/storage/v1/b/{self.bucket}/o"
        params = {"uploadType": "media", "name": self.key, "ifGenerationMatch": generation}
        # A content type, as every object of the store has one (clients parse it).
        headers = {"Content-Type": "application/octet-stream"}
        answer = self._request("POST", url, params=params, data=body, headers=headers)
        if answer.status_code in (404, 409, 412):
            return None
        answer.raise_for_status()
        return str(answer.json()["generation"])

    def create(self, body: bytes) -> str | None:
        return self._put(body, "0")

    def replace(self, body: bytes, tag: str) -> str | None:
        return self._put(body, tag)

    def read(self) -> tuple[bytes, str, float] | None:
        meta = self._request("GET", self.object)
        if meta.status_code == 404:
            return None
        meta.raise_for_status()
        info = meta.json()
        generation = str(info["generation"])
        media = self._request(
            "GET", self.object, params={"alt": "media", "ifGenerationMatch": generation}
        )
        if media.status_code in (404, 412):
            return None  # changed meanwhile: the caller looks again
        media.raise_for_status()
        return media.content, generation, _age(meta.headers.get("Date"), info["updated"])

    def delete(self, tag: str) -> None:
        answer = self._request("DELETE", self.object, params={"ifGenerationMatch": tag})
        if answer.status_code not in (404, 412):
            answer.raise_for_status()


def _client(url: str) -> _S3 | _GCS:
    return _GCS(url) if url.startswith("gs://") else _S3(url)


def _failure(url: str, what: str, exc: BaseException) -> OutputError:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return OutputError(f"{url}: cannot {what} ({text})")


class ObjectLock:
    """A held lock object: renewed in the background; `check()` before a commit point
    raises if it was lost (not renewed for the TTL, or taken over)."""

    def __init__(self, output: str, url: str, client: Any, record: dict, ttl: float):
        self.output, self.url, self._client, self.ttl = output, url, client, ttl
        self._record = record
        self._tag: str | None = None
        self._lost: str | None = None
        self._renewed = time.monotonic()
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self) -> bytes:
        return json.dumps({**self._record, "renewed": time.time()}).encode()

    def acquire(self) -> None:
        host = self._record["host"]
        for _ in range(_TRIES):
            try:
                tag = self._client.create(self._body())
                if tag is not None:
                    break
                current = self._client.read()
                if current is None:
                    continue  # released meanwhile
                data, tag, age = current
                holder = parse_record(data)
                if holder.get("token") == self._record["token"]:
                    break  # our own create, whose answer was lost and retried
                if not self._stale(holder, age, host):
                    raise held_by(
                        self.output,
                        holder,
                        self.url,
                        f" (a lock not renewed for {self.ttl:g} s is taken over)",
                    )
                tag = self._client.replace(self._body(), tag)
                if tag is not None:
                    break  # of all the writers taking it over, only one gets here
            except ConfigError:
                raise
            except Exception as exc:
                raise _failure(self.url, "take the lock", exc) from None
        else:
            raise ConfigError(f"{self.output}: cannot take the lock {self.url}; remove it")
        self._tag, self._renewed = tag, time.monotonic()
        self._thread = threading.Thread(target=self._renew_loop, daemon=True)
        self._thread.start()

    def _stale(self, holder: dict, age: float, host: str) -> bool:
        """Damaged; not renewed for the holder's TTL (the larger of its and ours: a holder
        with a longer TTL renews less often); or its pid is dead on this very machine."""
        theirs = holder.get("ttl")
        ttl = max(self.ttl, theirs if isinstance(theirs, int | float) else 0)
        if not holder or age > ttl:
            return True
        pid = holder.get("pid")
        return same_machine(holder, host) and isinstance(pid, int) and not pid_alive(pid)

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            with self._mutex:
                if self._lost is not None or self._tag is None:
                    return
                sent = time.monotonic()  # others count the TTL from about now
                try:
                    tag = self._client.replace(self._body(), self._tag)
                    if tag is None:
                        tag = self._still_ours()
                except Exception:
                    tag = ""  # a failed request: try again next time
                if tag is None:
                    self._lost = "another writer took it over"
                elif tag:
                    self._tag, self._renewed = tag, sent
                elif time.monotonic() - self._renewed > self.ttl:
                    self._lost = f"it could not be renewed for {self.ttl:g} s"

    def _still_ours(self) -> str | None:
        """After a renewal's precondition failed: our own version (tag) if the lock holds our
        token (a renewal applied whose answer was lost, then retried), else None."""
        current = self._client.read()
        if current is None:
            return None
        data, tag, _age = current
        return tag if parse_record(data).get("token") == self._record["token"] else None

    def check(self) -> None:
        """Raise OutputError if the lock was lost: writing on could overwrite another's."""
        with self._mutex:
            lost = self._lost
            if lost is None and time.monotonic() - self._renewed > self.ttl:
                lost = f"it could not be renewed for {self.ttl:g} s"
        if lost is not None:
            raise OutputError(f"{self.output}: lost its lock {self.url} ({lost}); stopped")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._mutex:
            tag, self._tag = self._tag, None
        if tag is None or self._lost is not None:
            return
        try:
            self._client.delete(tag)
        except Exception:
            pass  # left behind: stale once this process is gone, or after the TTL


@contextmanager
def object_lock(output: str) -> Iterator[ObjectLock]:
    """Hold the lock object of the output URL `output` for the block (see the module
    docstring); ConfigError if another writer holds it or the client is not installed."""
    output = output.rstrip("/")
    url = lock_url(output)
    record = lock_record(token=secrets.token_hex(8), ttl=_ttl())
    held = ObjectLock(output, url, _client(url), record, record["ttl"])
    held.acquire()
    try:
        yield held
    finally:
        held.release()
