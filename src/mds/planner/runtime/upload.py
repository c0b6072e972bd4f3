"""Uploading an index's or a plan's files to object storage so that no reader, and no
interrupted writer, ever sees a part of an object: each goes to a hidden temporary key and
is copied over its name in one atomic step. Writers only: boto3 (the `s3` extra) for what
pyarrow cannot do, here a copy of more than 5 GiB."""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

from mds.core import commit, storage
from mds.errors import ConfigError, install_hint

__all__ = ["COPY_LIMIT", "put_file", "s3_client"]

# S3 CopyObject copies at most 5 GiB in one request; GCS copies (rewrites) any size.
COPY_LIMIT = 5 << 30


def _upload(fs: Any, local: str | os.PathLike, key: str) -> None:
    # the local file is opened first: a stream closed by a failed open would complete
    with open(local, "rb") as f, fs.open_output_stream(key) as out:
        while piece := f.read(8 << 20):
            out.write(piece)


@functools.lru_cache(maxsize=8)
def _s3_client(endpoint: str | None, region: str | None, timeout: float, tries: int) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=timeout,
        read_timeout=timeout,
        retries={"max_attempts": tries, "mode": "standard"},
    )
    with _CLIENTS:  # clients are thread-safe, making one is not
        return boto3.session.Session().client(
            "s3", endpoint_url=endpoint, region_name=region, config=config
        )


_CLIENTS = threading.Lock()


def s3_client() -> Any:
    """A boto3 S3 client for the current environment (the endpoint, region, timeout and
    attempts the pyarrow filesystem uses), cached per settings. Writers need boto3 for what
    pyarrow cannot do: conditional requests, and copies of more than 5 GiB."""
    timeout = storage.request_timeout()
    return _s3_client(*storage.s3_endpoint_region(), timeout, storage.attempts())


def _copy(fs: Any, url: str, src: str, size: int) -> None:
    """Put the object `src` (a bucket/key) over `url` whole: one CopyObject, or for S3
    objects over COPY_LIMIT, a multipart copy whose completion is the one atomic step
    (boto3 aborts it on failure)."""
    if not (url.startswith("s3://") and size > COPY_LIMIT):
        fs.copy_file(src, storage.object_key(url))
        return
    try:
        import boto3  # noqa: F401
    except ImportError:
        raise ConfigError(
            f"writing {url} (over 5 GiB) needs boto3 for a multipart copy: "
            f"{install_hint('s3')}"
        ) from None
    bucket, _, key = storage.object_key(url).partition("/")
    from_bucket, _, from_key = src.partition("/")
    try:
        s3_client().copy({"Bucket": from_bucket, "Key": from_key}, bucket, key)
    except Exception as exc:  # botocore's errors: one line naming the object
        raise OSError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None


def put_file(local: str | os.PathLike, url: str) -> None:
    """Upload a local file as the object `url`, so that readers (and an interrupted writer)
    see the old object or the new one whole, never a part.

    A stream closed while an exception unwinds still completes its upload, so the bytes go
    to a temporary sibling (temp_url) which a copy puts over `url` (atomic on S3 and GCS;
    see _copy), with SIGINT/SIGTERM held for the copy so that after it we know whether
    `url` changed; the temporary is then deleted. An interrupt after `url` was written
    raises Interrupted saying so."""
    fs = storage.filesystem(url)
    committed = f"the interrupt came after {url} was written whole"
    tmp = commit.temp_url(url)
    try:
        try:
            _upload(fs, local, storage.object_key(tmp))
        except OSError as exc:
            raise storage.failure(url, "write", exc) from None
        with commit.signals_held() as held:
            try:
                _copy(fs, url, storage.object_key(tmp), os.path.getsize(local))
            except OSError as exc:
                commit.deliver_held(held, None)
                raise storage.failure(url, "write", exc) from None
            except BaseException:
                commit.deliver_held(held, None)
                raise
            commit.note_written(url)
        commit.deliver_held(held, committed)
    finally:
        try:  # best effort: a leftover temporary is hidden, never read as data
            fs.delete_file(storage.object_key(tmp))
        except OSError:
            pass
