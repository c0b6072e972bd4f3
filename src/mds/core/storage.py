"""Where the data lies: the data root a plan or an index is pointed at, the one way to
re-point it when the data moved, and reading files or objects (s3://) under it.

The root is, in this order: the caller's argument (`data_root=`, `--data-root`), the
environment variable `MDS_DATA_ROOT` (for launchers), or the root the plan or the index
records. Identity of the data is its content (fingerprints), so a moved copy replays the
same plan.
"""

from __future__ import annotations

import calendar
import functools
import os
import posixpath
import re
import secrets
from pathlib import Path, PurePosixPath
from typing import Any

from mds.core.commit import temp_url
from mds.errors import ConfigError, SourceDataError

__all__ = [
    "DATA_ROOT_ENV",
    "MOVED_HINT",
    "ObjectStat",
    "as_place",
    "credentials_hint",
    "delete",
    "env_number",
    "exists",
    "filesystem",
    "get_bytes",
    "given_root",
    "is_url",
    "join",
    "list_object_infos",
    "list_objects",
    "missing_hint",
    "object_key",
    "object_version",
    "open_input",
    "opened_stat",
    "parent_url",
    "plan_data_root",
    "read_exact",
    "relocated",
    "replaced",
    "request_timeout",
    "resolve_under",
    "s3_endpoint_region",
    "short_read",
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


def _is_dir(path: Path) -> bool:
    """Whether `path` is a directory; a name the OS refuses (too long, say) is not one."""
    try:
        return path.is_dir()
    except OSError:
        return False


def plan_data_root(
    plan_path: Path | str, recorded: str, given: str | os.PathLike | None
) -> tuple[Path | str, Path | str | None]:
    """Where a plan's data lies, and where the plan records it: `given` (data_root=), else
    $MDS_DATA_ROOT, else the root the plan records (relative to its own directory, or a
    URL). A local root in use must be a directory."""
    given, origin = given_root(given)
    own: Path | str | None
    if is_url(recorded):
        own = recorded.rstrip("/")
    elif is_url(plan_path) and not os.path.isabs(recorded):  # beside a plan's object
        own = resolve_under(parent_url(str(plan_path)), recorded)
    elif is_url(plan_path):
        own = Path(recorded)
    else:
        own = Path(os.path.normpath(Path(plan_path).absolute().parent / recorded))
    if given is not None and is_url(given):
        return given.rstrip("/"), own
    if given is not None:
        root = Path(given)
        if not _is_dir(root):
            raise ConfigError(f"{origin}={str(given)!r} is not a directory")
        return root.absolute(), own
    if isinstance(own, Path) and not _is_dir(own):
        raise ConfigError(
            f"{plan_path}: its data root was expected at {own} (recorded relative to the "
            f"plan's directory as {recorded!r}); the plan or the data moved: {MOVED_HINT}"
        )
    return own, own


def relocated(root: Path | str, recorded: Path | str | None) -> bool:
    """Whether the data root in use is another place than the recorded one (where the data
    was indexed): files there are then checked by content on first use, since a copy keeps
    names, sizes and (`cp -p`, `rsync -a`) mtimes whatever its bytes are. An unknown
    recorded root (None) counts as another place."""
    if recorded is None:
        return True
    if is_url(root) or is_url(recorded):
        return str(root).rstrip("/") != str(recorded).rstrip("/")
    a, b = os.path.normpath(os.path.abspath(root)), os.path.normpath(os.path.abspath(recorded))
    if a == b:
        return False
    try:
        return not os.path.samefile(a, b)  # one directory by two names (a symlink)
    except OSError:
        return True


# --- object storage -----------------------------------------------------------------------
#
# Objects are reached through pyarrow.fs.S3FileSystem (built into pyarrow's wheels, so no
# new dependency). Credentials come from the store's usual chain (AWS_* variables,
# ~/.aws/credentials and config, instance metadata), never from a plan or an index; the
# endpoint from AWS_ENDPOINT_URL for S3-compatible servers. Every request has a timeout
# (MDS_S3_TIMEOUT seconds) and is retried with bounded backoff (MDS_S3_ATTEMPTS attempts in
# all); what still fails is a SourceDataError naming the object's URL.

SCHEMES = ("s3://", "gs://")
GCS_EMULATOR_ENV = "STORAGE_EMULATOR_HOST"  # the Google client libraries' variable
TIMEOUT_ENV, ATTEMPTS_ENV = "MDS_S3_TIMEOUT", "MDS_S3_ATTEMPTS"
_DEFAULT_TIMEOUT, _DEFAULT_ATTEMPTS = 20.0, 4


def is_url(path: Any) -> bool:
    """Whether `path` names an object in a store (s3:// or gs://bucket/key), not a file."""
    return isinstance(path, str) and path.startswith(SCHEMES)


def as_place(path: str | os.PathLike) -> Path | str:
    """A path a user gave: a URL kept as the string it is (a `Path` would fold its `//`
    into `/`, and every message would name `s3:/bucket/...`), anything else a `Path`."""
    return str(path).rstrip("/") if is_url(path) else Path(path)


def join(root: str | os.PathLike, rel: str) -> str | Path:
    """`rel` (a POSIX relative path) under a root directory or URL."""
    if is_url(root):
        return f"{str(root).rstrip('/')}/{rel}"
    return Path(root).joinpath(*PurePosixPath(rel).parts)


def env_number(name: str, default: float, kind: type) -> Any:
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


def request_timeout() -> float:
    """Seconds a store's request may take (MDS_S3_TIMEOUT)."""
    return env_number(TIMEOUT_ENV, _DEFAULT_TIMEOUT, float)


def attempts() -> int:
    return env_number(ATTEMPTS_ENV, _DEFAULT_ATTEMPTS, int)


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


@functools.lru_cache(maxsize=8)
def _gcs(emulator: str | None, timeout: float, tries: int) -> Any:
    from datetime import timedelta

    from pyarrow import fs

    # The GCS client retries for a time, not a count: the requests' time budget in all.
    limit = timedelta(seconds=timeout * tries)
    if emulator:  # a local emulator: plain HTTP, no credentials
        scheme, _, host = emulator.rpartition("://")
        return fs.GcsFileSystem(
            anonymous=True,
            endpoint_override=host.rstrip("/"),
            scheme=scheme or "http",
            retry_time_limit=limit,
        )
    return fs.GcsFileSystem(retry_time_limit=limit)


def filesystem(url: str = "s3://") -> Any:
    """The filesystem of the store `url` is in, for the current environment (cached per
    endpoint and settings). gs://: Google's default credentials chain (application default
    credentials, GOOGLE_APPLICATION_CREDENTIALS, the metadata server), or the emulator that
    $STORAGE_EMULATOR_HOST names, without credentials."""
    timeout = request_timeout()
    if str(url).startswith("gs://"):
        return _gcs(os.environ.get(GCS_EMULATOR_ENV, "").strip() or None, timeout, attempts())
    return _s3(*s3_endpoint_region(), timeout, attempts())


def s3_endpoint_region() -> tuple[str | None, str | None]:
    """The S3 endpoint (AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL) and region (AWS_REGION,
    else AWS_DEFAULT_REGION) of the environment, None where unset."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    return endpoint or None, region or None


def object_key(url: str) -> str:
    """bucket/key, as pyarrow's S3 and GCS filesystems name an object."""
    return url.split("://", 1)[1].strip("/")


# What a store answers when the credentials are missing, wrong or not allowed to read.
_DENIED = ("ACCESS_DENIED", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
           "PERMISSION_DENIED", "Forbidden", "Unauthorized", "credentials")  # fmt: skip


def missing_hint(url: str) -> str:
    """The fix for an object that is not there: check the URL against a listing."""
    ls = "gcloud storage ls" if url.startswith("gs://") else "aws s3 ls"
    return f"check the URL (`{ls} {parent_url(url)}/` lists what is there)"


def credentials_hint(url: str) -> str:
    """The fix for a request the store refused: where the credentials come from."""
    if url.startswith("gs://"):
        return (
            "check Google's credentials (GOOGLE_APPLICATION_CREDENTIALS, or `gcloud auth "
            "application-default login`) and that they may read the bucket"
        )
    return (
        "check the AWS credentials (AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY) and that they may read the bucket"
    )


def failure(url: str, what: str, exc: BaseException) -> SourceDataError:
    if isinstance(exc, FileNotFoundError):
        return SourceDataError(f"{url}: missing (no such object)")
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    hint = f"; {credentials_hint(url)}" if any(d in text for d in _DENIED) else ""
    n = attempts()
    if url.startswith("gs://"):
        limit = n * request_timeout()
        return SourceDataError(
            f"{url}: cannot {what} after retrying for {limit:g} s ({text}){hint}"
        )
    return SourceDataError(f"{url}: cannot {what} after {n} attempt{'s' * (n > 1)} ({text}){hint}")


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
        info = filesystem(str(path)).get_file_info(object_key(str(path)))
    except OSError as exc:
        raise failure(str(path), "stat", exc) from None
    if info.type != fs.FileType.File:
        raise SourceDataError(f"{path}: missing (no such object)")
    return ObjectStat(int(info.size), int(info.mtime_ns or 0))


def object_version(handle: Any, url: str) -> tuple:
    """("object", size, tag) of an open object: the tag is the ETag (S3) or the generation
    (GCS) the store gave when the handle was opened, so two opens of one version compare
    equal and a rewritten object does not."""
    try:
        meta = handle.metadata()
        size = int(handle.size())
    except OSError as exc:
        raise failure(url, "stat", exc) from None
    tag = meta.get("ETag") or meta.get("generation") or meta.get("etag") or b""
    return ("object", size, bytes(tag).decode("ascii", "replace"))


# The modification time an open's metadata gives: S3's Last-Modified (whole seconds, as the
# HEAD's header has it) or GCS's `updated` (RFC 3339, with a fraction of a second).
_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(?:Z|[+-]00:?00)")


def opened_stat(handle: Any, url: str) -> ObjectStat | None:
    """The size and mtime `stat` gives of an object, from what its open (one metadata
    request) returned: the same request serves the start-up check and the reader. None
    where the store's answer has no time this parses (then `stat` asks)."""
    try:
        meta = handle.metadata()
        size = int(handle.size())
    except OSError as exc:
        raise failure(url, "stat", exc) from None
    raw = meta.get("Last-Modified") or meta.get("updated")
    found = _TIME.fullmatch(bytes(raw).decode("ascii", "replace").strip()) if raw else None
    if found is None:
        return None
    *fields, fraction = found.groups()
    seconds = calendar.timegm(tuple(int(f) for f in fields))
    return ObjectStat(size, seconds * 10**9 + int((fraction or "").ljust(9, "0")))


def version(url: str) -> tuple:
    """The `object_version` of the object `url` now (one metadata request)."""
    handle = open_input(url)
    try:
        return object_version(handle, url)
    finally:
        handle.close()


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


def open_input(path: str | os.PathLike, what: str = "open") -> Any:
    """A pyarrow random-access file: reads of an object are byte-range requests. An object's
    open is one metadata request; `what` it is for names it in a failure's message."""
    import pyarrow as pa

    if not is_url(path):
        return pa.OSFile(os.fspath(path))
    try:
        return filesystem(str(path)).open_input_file(object_key(str(path)))
    except OSError as exc:
        raise failure(str(path), what, exc) from None


def list_objects(url: str) -> list[tuple[str, int]]:
    """(key relative to `url`, size) of every object under the prefix `url`, sorted."""
    return [(key, size) for key, size, _mtime in list_object_infos(url)]


def list_object_infos(url: str) -> list[tuple[str, int, int]]:
    """(key relative to `url`, size, mtime_ns) of every object under the prefix `url`,
    sorted: the listing's own sizes and modification times, with no request per object."""
    from pyarrow import fs

    prefix = object_key(url)
    try:
        selector = fs.FileSelector(prefix, recursive=True, allow_not_found=True)
        infos = filesystem(url).get_file_info(selector)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise failure(url, "list", exc) from None
    out = [
        (info.path[len(prefix) :].lstrip("/"), int(info.size), int(info.mtime_ns or 0))
        for info in infos
        if info.type == fs.FileType.File
    ]
    return sorted(out)


def delete(url: str) -> None:
    """Remove the object `url` (gone already is fine)."""
    try:
        filesystem(url).delete_file(object_key(url))
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise failure(url, "delete", exc) from None


def replaced(url: str, size: int) -> SourceDataError | None:
    """The error for reads of an object opened at `size` bytes that no longer has that size
    (it was replaced while being read: its bytes are another object's), else None."""
    try:
        now = stat(url).st_size
    except SourceDataError:
        return None
    if now == size:
        return None
    return SourceDataError(
        f"{url} changed while it was being read (it was replaced; {size} bytes when opened, "
        f"{now} now)"
    )


def short_read(url: str, size: int, got: int, want: int, offset: int) -> SourceDataError:
    """The error for a read of an object (opened at `size` bytes) that returned `got` of
    the `want` bytes asked for at `offset`: replaced, or a short answer of the server."""
    return replaced(url, size) or SourceDataError(
        f"short read from {url} (got {got} of {want} bytes at offset {offset})"
    )


# pyarrow's S3 reads report every byte asked for even when the server sent fewer (the rest
# of the buffer is left as it was), so a read goes into a buffer filled with a pattern
# first, and a buffer whose end still holds it is read again over the opposite pattern:
# a data byte equals at most one of the two, so the bytes both leave in place are exactly
# those the server did not send. Random per process: no data is made to match it.
_FILL = secrets.token_bytes(64)
_OTHER = bytes(b ^ 0xFF for b in _FILL)


def _unfilled(buf: bytearray, fill: bytes) -> int:
    """How many bytes at the end of `buf` still hold the pattern `fill` (tiled from 0)."""
    n, w = len(buf), len(fill)
    k, r = n, n % w
    if r == 0 or buf[n - r :] == fill[:r]:  # whole periods at C speed, then byte by byte
        k = n - r
        while k >= w and buf[k - w : k] == fill:
            k -= w
    while k > 0 and buf[k - 1] == fill[(k - 1) % w]:
        k -= 1
    return n - k


def _read_into(f: Any, url: str, size: int, start: int, want: int, fill: bytes) -> bytearray:
    buf = bytearray(fill) * (want // len(fill) + 1)
    del buf[want:]
    try:
        # a segment of a pyarrow file reads at its own offset (ReadAt, which Arrow's files,
        # S3's and GCS's among them, serve from several threads at once): the file's own
        # position is not moved, so one open handle serves concurrent reads
        if hasattr(f, "get_stream"):
            got = f.get_stream(start, want).readinto(buf)
        else:  # a Python file object
            f.seek(start)
            got = f.readinto(buf)
    except OSError as exc:
        raise replaced(url, size) or failure(url, "read", exc) from None
    if got < want:
        raise short_read(url, size, got, want, start)
    return buf


def read_exact(f: Any, url: str, size: int, start: int, want: int) -> bytes:
    """Bytes [start, start + want) of the object `url` (opened, at `size` bytes, as the
    pyarrow file `f`, whose position does not move: threads may read one `f` at once):
    SourceDataError if the read fails or the server sent fewer bytes (short_read: names the
    object, or says it was replaced)."""
    if want <= 0:
        return b""
    buf = _read_into(f, url, size, start, want, _FILL)
    first = _unfilled(buf, _FILL)
    if first == 0:
        return bytes(buf)
    again = _read_into(f, url, size, start, want, _OTHER)  # 1 read in 256 by chance
    second = _unfilled(again, _OTHER)
    if second == 0:
        return bytes(again)
    raise short_read(url, size, want - min(first, second), want, start)


def get_bytes(url: str) -> bytes:
    """The whole object `url`, one request."""
    try:
        f = filesystem(url).open_input_file(object_key(url))
        size = f.size()
    except OSError as exc:
        raise failure(url, "read", exc) from None
    with f:
        return read_exact(f, url, size, 0, size)


def put_bytes(url: str, data: bytes) -> None:
    """Write a small object whole: `data` goes to a hidden temporary sibling, which one copy
    puts over `url` (atomic on S3 and GCS), then the temporary is deleted. Readers see the
    old object or the new one, never a part (large files: planner.runtime.upload)."""
    fs = filesystem(url)
    tmp = object_key(temp_url(url))
    try:
        try:
            with fs.open_output_stream(tmp) as out:
                out.write(data)
            fs.copy_file(tmp, object_key(url))
        except OSError as exc:
            raise failure(url, "write", exc) from None
    finally:
        try:  # best effort: a leftover temporary is hidden, never read as data
            fs.delete_file(tmp)
        except OSError:
            pass


def parent_url(url: str) -> str:
    """The "directory" of an object's URL (everything before its last /)."""
    return url.rstrip("/").rsplit("/", 1)[0]


def resolve_under(base: str, rel: str) -> str:
    """`rel` (a POSIX path, maybe with ..) relative to the URL prefix `base`; a URL or an
    absolute path is returned as it is."""
    if is_url(rel) or rel.startswith("/"):
        return rel
    scheme, rest = base.split("://", 1)
    bucket, _, key = rest.partition("/")
    joined = posixpath.normpath(posixpath.join("/", key, rel)).lstrip("/")
    return f"{scheme}://{bucket}/{joined}".rstrip("/")
