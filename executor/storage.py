"""Where the data lies: the data root a plan or an index is pointed at, the one way to
re-point it when the data moved, and reading files or objects (s3://) under it.

The root is, in this order: the caller's argument (`data_root=`, `--data-root`), the
environment variable `MDS_DATA_ROOT` (for launchers), or the root the plan or the index
records. Identity of the data is its content (fingerprints), so a moved copy replays the
same plan.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any

from mds.executor.errors import ConfigError, SourceDataError

__all__ = [
    "DATA_ROOT_ENV",
    "MOVED_HINT",
    "ObjectStat",
    "RangeFile",
    "exists",
    "filesystem",
    "given_root",
    "is_url",
    "join",
    "list_objects",
    "open_input",
    "stat",
]

DATA_ROOT_ENV = "MDS_DATA_ROOT"
MOVED_HINT = (
    "pass data_root= (or --data-root, or set MDS_DATA_ROOT) with the directory that now holds "
    "the indexed data; no re-index or re-plan is needed"
)


def given_root(argument: str | os.PathLike | None) -> tuple[str | None, str]:
    """The data root the caller asked for, and where it came from (for messages):
    the argument, else $MDS_DATA_ROOT, else (None, "") to use the recorded root."""
    if argument is not None:
        return os.fspath(argument), "data_root"
    env = os.environ.get(DATA_ROOT_ENV, "").strip()
    if env:
        return env, DATA_ROOT_ENV
    return None, ""


# --- object storage -----------------------------------------------------------------------
#
# Objects are reached through pyarrow.fs.S3FileSystem (built into pyarrow's wheels, so no
# new dependency). Credentials come from the store's usual chain (AWS_* variables,
# ~/.aws/credentials and config, instance metadata), never from a plan or an index; the
# endpoint from AWS_ENDPOINT_URL for S3-compatible servers. Every request has a timeout
# (MDS_S3_TIMEOUT seconds) and is retried with bounded backoff (MDS_S3_ATTEMPTS attempts in
# all); what still fails is a SourceDataError naming the object's URL.

SCHEMES = ("s3://",)
TIMEOUT_ENV, ATTEMPTS_ENV = "MDS_S3_TIMEOUT", "MDS_S3_ATTEMPTS"
_DEFAULT_TIMEOUT, _DEFAULT_ATTEMPTS = 20.0, 4
OBJECT_FORMATS = ("parquet", "jsonl")  # read with range requests; the others need a file
NOT_FROM_OBJECTS = (
    "{fmt} sources are not read from object storage yet (only parquet and jsonl); copy the "
    "files to a local or shared file system and point the data root there"
)
RANGE_BLOCK = 256 << 10  # unit of range reads, kept in the block cache


def is_url(path: Any) -> bool:
    """Whether `path` names an object in a store (s3://bucket/key) rather than a file."""
    return isinstance(path, str) and path.startswith(SCHEMES)


def join(root: str | os.PathLike, rel: str) -> str | Path:
    """`rel` (a POSIX relative path) under a root directory or URL."""
    if is_url(root):
        return f"{str(root).rstrip('/')}/{rel}"
    return Path(root).joinpath(*PurePosixPath(rel).parts)


def _env_number(name: str, default: float, kind: type) -> Any:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"{name}={raw!r} must be a positive number")
    return value


def attempts() -> int:
    return _env_number(ATTEMPTS_ENV, _DEFAULT_ATTEMPTS, int)


@functools.lru_cache(maxsize=8)
def _s3(endpoint: str | None, region: str | None, timeout: float, tries: int) -> Any:
    from pyarrow import fs

    return fs.S3FileSystem(
        endpoint_override=endpoint,
        region=region,
        connect_timeout=timeout,
        request_timeout=timeout,
        retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=tries),
    )


def filesystem() -> Any:
    """The S3 filesystem for the current environment (cached per endpoint and settings)."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    timeout = _env_number(TIMEOUT_ENV, _DEFAULT_TIMEOUT, float)
    return _s3(endpoint or None, region or None, timeout, attempts())


def _key(url: str) -> str:
    """bucket/key, as pyarrow's S3 filesystem names an object."""
    return url.split("://", 1)[1].strip("/")


def failure(url: str, what: str, exc: BaseException) -> SourceDataError:
    if isinstance(exc, FileNotFoundError):
        return SourceDataError(f"{url}: missing (no such object)")
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    n = attempts()
    return SourceDataError(f"{url}: cannot {what} after {n} attempt{'s' * (n > 1)} ({text})")


class ObjectStat:
    """An object's size and modification time, shaped like the os.stat_result fields the
    checks and caches use (an object has no device or inode)."""

    st_dev = st_ino = 0

    def __init__(self, size: int, mtime_ns: int):
        self.st_size, self.st_mtime_ns = size, mtime_ns


def stat(path: str | os.PathLike) -> os.stat_result | ObjectStat:
    """os.stat for a file; size and mtime of an object (SourceDataError if it fails)."""
    if not is_url(path):
        return os.stat(path)
    from pyarrow import fs

    try:
        info = filesystem().get_file_info(_key(str(path)))
    except OSError as exc:
        raise failure(str(path), "stat", exc) from None
    if info.type != fs.FileType.File:
        raise SourceDataError(f"{path}: missing (no such object)")
    return ObjectStat(int(info.size), int(info.mtime_ns or 0))


def exists(path: str | os.PathLike) -> bool:
    if not is_url(path):
        return os.path.lexists(path)
    try:
        stat(path)
    except SourceDataError as exc:
        if str(exc).endswith("missing (no such object)"):
            return False
        raise
    return True


def open_input(path: str | os.PathLike) -> Any:
    """A pyarrow random-access file: reads of an object are byte-range requests."""
    import pyarrow as pa

    if not is_url(path):
        return pa.OSFile(os.fspath(path))
    try:
        return filesystem().open_input_file(_key(str(path)))
    except OSError as exc:
        raise failure(str(path), "open", exc) from None


def list_objects(url: str) -> list[tuple[str, int]]:
    """(key relative to `url`, size) of every object under the prefix `url`, sorted."""
    from pyarrow import fs

    prefix = _key(url)
    try:
        infos = filesystem().get_file_info(fs.FileSelector(prefix, recursive=True))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise failure(url, "list", exc) from None
    out = [
        (info.path[len(prefix) :].lstrip("/"), int(info.size))
        for info in infos
        if info.type == fs.FileType.File
    ]
    return sorted(out)


class RangeFile:
    """Byte ranges of one object, read in aligned blocks of RANGE_BLOCK bytes through the
    shared, byte-bounded block cache: one call fetches the blocks it lacks, neighbours in
    one request, so a step's lines of an object cost a few requests, and a block read
    again while cached costs none."""

    def __init__(self, url: str, blocks: Any):
        self.url, self._blocks = url, blocks
        self._file = open_input(url)
        try:
            self.size = int(self._file.size())
        except OSError as exc:
            raise failure(url, "stat", exc) from None

    def read_ranges(self, starts: Any, sizes: Any) -> list[bytes]:
        spans = [(int(s), int(n)) for s, n in zip(starts, sizes, strict=True)]
        need = sorted(
            {
                b
                for s, n in spans
                if n > 0
                for b in range(s // RANGE_BLOCK, (s + n - 1) // RANGE_BLOCK + 1)
            }
        )
        have = {b: self._blocks.get((self.url, "range", b)) for b in need}
        missing = [b for b in need if have[b] is None]
        runs = _runs(missing)  # neighbouring blocks: one request; runs: requests in parallel
        for (first, last), data in zip(runs, _parallel(self._read_run, runs), strict=True):
            for b in range(first, last + 1):
                piece = bytes(data[(b - first) * RANGE_BLOCK : (b - first + 1) * RANGE_BLOCK])
                have[b] = piece
                self._blocks.put((self.url, "range", b), piece, len(piece))
        out = []
        for s, n in spans:
            if n <= 0:
                out.append(b"")
                continue
            first, last = s // RANGE_BLOCK, (s + n - 1) // RANGE_BLOCK
            joined = b"".join(have[b] for b in range(first, last + 1))
            at = s - first * RANGE_BLOCK
            out.append(joined[at : at + n])
        return out

    def _read_run(self, run: tuple[int, int]) -> bytes:
        lo = run[0] * RANGE_BLOCK
        hi = min((run[1] + 1) * RANGE_BLOCK, self.size)
        try:
            return self._file.read_at(hi - lo, lo)
        except OSError as exc:
            raise failure(self.url, "read", exc) from None

    def close(self) -> None:
        self._file.close()


_REQUESTS = 8  # range requests of one call in flight at once
_pool: tuple[int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()  # the threads reading a step's files may both make the pool


def _new_pool_lock_in_child() -> None:
    global _pool_lock
    _pool_lock = threading.Lock()  # a lock held by another thread at fork stays held


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_pool_lock_in_child)


def _parallel(read: Callable[[Any], bytes], items: list) -> list[bytes]:
    """`read` of every item, up to _REQUESTS at a time (a store answers requests in
    parallel; their latency, not the bandwidth, bounds a step's scattered reads). The
    pool is made per process: a forked DataLoader worker has none of its parent's threads."""
    global _pool
    if len(items) <= 1:
        return [read(item) for item in items]
    pool = _pool
    if pool is None or pool[0] != os.getpid():
        with _pool_lock:
            if _pool is None or _pool[0] != os.getpid():
                _pool = (os.getpid(), ThreadPoolExecutor(_REQUESTS, thread_name_prefix="mds-range"))
            pool = _pool
    return list(pool[1].map(read, items))


def _runs(blocks: list[int]) -> list[tuple[int, int]]:
    """Sorted block numbers as (first, last) runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for b in blocks:
        if runs and b == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], b)
        else:
            runs.append((b, b))
    return runs
