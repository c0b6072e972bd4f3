"""Builders for tests/test_faults.py: a small four-source data root, byte-level plan damage,
a full disk, and a deterministic pause inside a real `mds` subprocess to interrupt it.

A plain module (tests/conftest.py puts tests/ on sys.path): `from fault_builders import ...`.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
from builders import config_file, jsonl_bytes, snapshot, write_jsonl, write_parquet, write_zst
from cli_helpers import mds
from planfile_builders import footer_json

REPO = Path(__file__).resolve().parents[1]
MDS_BIN = REPO / ".venv" / "bin" / "mds"
if not MDS_BIN.exists():  # another environment: the console script next to this interpreter
    MDS_BIN = Path(sys.executable).with_name("mds")

# --- the data root -----------------------------------------------------------------------------

WORLD_TOML = """
[index]
output = "index"

[[source]]
name = "web"
path = "web/*.parquet"
tokens = "tokens"
keep = ["lang"]
weight = 0.4

[[source]]
name = "books"
path = "books/books.parquet"
count = "n"
text = "text"
weight = {books_weight}
{books_extra}

[[source]]
name = "forum"
path = "forum/forum.jsonl"
tokens = "ids"
weight = 0.2

[[source]]
name = "code"
path = "code/*.jsonl.zst"
count = "n"
text = "text"
weight = 0.2
{extra}
[plan]
chunk_steps = 2

[train]
steps = 6
dp_size = 2
micro_batches = 2
samples_per_step = 8
max_tokens_per_micro_batch = {capacity}
seed = 11
"""


def words(n: int) -> str:
    """A text of `n` words: `word_ids` counts it as n tokens."""
    return " ".join(["w"] * n)


def word_ids(text: str) -> list[int]:
    """tokenize= for the world's text sources: one token per whitespace-separated word."""
    return [len(w) for w in text.split()]


def web_columns(i: int, rows: int = 10) -> dict[str, Any]:
    return {
        "tokens": pa.array(
            [list(range(1 + (r * 5 + i) % 13)) for r in range(rows)], pa.list_(pa.int32())
        ),
        "lang": [("en", "fr")[(r + i) % 2] for r in range(rows)],
    }


BOOK_LENGTHS = [7, 30, 12, 5, 21, 9, 16, 3]
FORUM = [{"ids": list(range(1 + r % 7))} for r in range(12)]
CODE = [{"n": 1 + r % 9, "text": words(1 + r % 9)} for r in range(16)]


def world_toml(
    *, books_weight: Any = 0.2, books_extra: str = "", capacity: int = 64, extra: str = ""
) -> str:
    """The world's mds.toml; `books_extra` adds keys to books, `extra` adds [[source]] tables."""
    return WORLD_TOML.format(
        books_weight=books_weight, books_extra=books_extra, capacity=capacity, extra=extra
    )


def write_world(root: Path, **toml: Any) -> Path:
    """Write the four sources under `root` and its mds.toml; return the config path.

    web: two Parquet files of token lists (+ lang); books: one Parquet file, count + text;
    forum: JSONL of token lists; code: .jsonl.zst in two zstd frames, count + text.
    """
    for i in range(2):
        write_parquet(root / f"web/part-{i}.parquet", web_columns(i))
    write_parquet(
        root / "books/books.parquet",
        {"n": pa.array(BOOK_LENGTHS, pa.int64()), "text": [words(n) for n in BOOK_LENGTHS]},
    )
    write_jsonl(root / "forum/forum.jsonl", FORUM)
    write_zst(root / "code/code.jsonl.zst", jsonl_bytes(CODE), frames=2)
    return config_file(root, world_toml(**toml))


def index_world(root: Path) -> Path:
    result = mds("index", root / "mds.toml")
    assert result.exit_code == 0, result.output
    return root / "index"


def plan_world(root: Path, output: Path | None = None, *args: Any) -> Path:
    output = output or root / "plan.mds"
    result = mds("plan", root / "mds.toml", "-o", output, *args)
    assert result.exit_code == 0, result.output
    return output


tree = snapshot  # every file under a directory, hidden ones included


def names(directory: Path) -> set[str]:
    """The entries directly in `directory`: a temporary left next to an output shows here."""
    return {p.name for p in directory.iterdir()}


# --- damage ------------------------------------------------------------------------------------


def flip_byte(path: Path, offset: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def truncate(path: Path, size: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:size])


def plan_layout(plan: Path) -> dict[str, Any]:
    return footer_json(plan.read_bytes())["layout"]


def block_span(plan: Path, chunk: int, rank: int) -> tuple[int, int]:
    """(offset, size) of the (chunk, rank) block, read from the chunk's directory by hand."""
    dir_offset = plan_layout(plan)["chunks"][chunk][2]
    with open(plan, "rb") as f:
        f.seek(dir_offset + 24 * rank)
        offset, size, _c = struct.unpack("<QQ8s", f.read(24))
    return offset, size


def set_plan_version(plan: Path, version: int) -> None:
    """Patch the header's u32 format version (bytes 8..12)."""
    data = bytearray(plan.read_bytes())
    struct.pack_into("<I", data, 8, version)
    plan.write_bytes(bytes(data))


# --- a full disk -------------------------------------------------------------------------------

NO_SPACE = os.strerror(errno.ENOSPC)  # "No space left on device"


class FullDisk(io.RawIOBase):
    """A raw file that takes `budget` bytes, then fails every write with ENOSPC, as write(2)
    does on a full filesystem (a short write, then the error). Wrapped in io.BufferedWriter it
    behaves like `open(path, "wb")` on that disk: buffered data fails at flush or close."""

    def __init__(self, path: os.PathLike | str, budget: int):
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.left = budget

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        return os.lseek(self._fd, pos, whence)

    def tell(self) -> int:
        return os.lseek(self._fd, 0, os.SEEK_CUR)

    def fileno(self) -> int:
        return self._fd

    def write(self, b) -> int:
        n = min(len(b), self.left)
        if n == 0:
            raise OSError(errno.ENOSPC, NO_SPACE)
        os.write(self._fd, bytes(memoryview(b)[:n]))
        self.left -= n
        return n

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def full_disk_open(budget: int, buffer_size: int = io.DEFAULT_BUFFER_SIZE) -> Callable[..., Any]:
    """An `open` whose binary writes go to a FullDisk of `budget` bytes; reads are real. A
    small `buffer_size` makes the failure land in the middle of the writes, not at close."""

    def fake_open(file, mode="r", *args, **kwargs):
        if mode == "wb":
            return io.BufferedWriter(FullDisk(file, budget), buffer_size)
        return builtins.open(file, mode, *args, **kwargs)

    return fake_open


def full_disk_write_bytes(real: Callable[..., Any], budget: int, match: Callable[[Path], bool]):
    """A `Path.write_bytes` that writes matching paths to a FullDisk of `budget` bytes."""

    def write_bytes(self: Path, data) -> int:
        if not match(self):
            return real(self, data)
        with io.BufferedWriter(FullDisk(self, budget)) as f:
            return f.write(data)

    return write_bytes


def full_disk_write_parquet(real: Callable[..., Any], budget: int):
    """A `polars.DataFrame.write_parquet` on a full disk: the first `budget` bytes of the file
    land, then polars' own error for ENOSPC (what writing to /dev/full raises)."""
    import polars as pl

    def write_parquet(self, file, *args, **kwargs):
        buf = io.BytesIO()
        real(self, buf, *args, **kwargs)
        Path(file).write_bytes(buf.getvalue()[:budget])
        raise pl.exceptions.ComputeError(
            "parquet: File out of specification: underlying IO error: "
            f"{NO_SPACE} (os error {errno.ENOSPC})"
        )

    return write_parquet


# --- interrupting a real `mds` process -----------------------------------------------------------

# Loaded by the child through PYTHONPATH before `mds` starts: it wraps one write step so the
# process announces (touches a file) that it is mid-write and then waits for the test's signal.
# No timing guesses: the signal always lands at the same point.
SITECUSTOMIZE = """
import fnmatch
import os
import select
import signal

_AT = os.environ.get("MDS_FAULT_AT")
_READY = os.environ.get("MDS_FAULT_READY")
_KEY = os.environ.get("MDS_FAULT_KEY", "*")  # put-*: the bucket/key glob to park at


def _park():
    # Wait for the test's SIGINT / SIGTERM (at most 120 s). Its handler acts as it would
    # anywhere: raises, or, where mds holds signals, notes it and lets this return.
    r, w = os.pipe()
    os.set_blocking(w, False)
    previous = signal.set_wakeup_fd(w)
    try:
        with open(_READY, "w"):
            pass
        select.select([r], [], [], 120)
    finally:
        signal.set_wakeup_fd(previous)
        os.close(r)
        os.close(w)


if _AT == "index-manifest":  # every new table is in place; the manifest is next
    import contextlib

    import mds.planner.runtime.atomic as atomic

    _real = atomic.atomic_path

    @contextlib.contextmanager
    def atomic_path(path):
        if path.name == "manifest.json":
            _park()
        with _real(path) as tmp:
            yield tmp

    atomic.atomic_path = atomic_path
elif _AT == "plan-chunk":  # two chunks are in the temporary plan file; more are coming
    import mds.core.planfile_writer as planfile_writer

    _real = planfile_writer.PlanWriter.add_chunk
    _seen = []

    def add_chunk(self, *args, **kwargs):
        _real(self, *args, **kwargs)
        _seen.append(1)
        if len(_seen) == 2:
            self._f.flush()
            _park()

    planfile_writer.PlanWriter.add_chunk = add_chunk
elif _AT in ("put-stream", "put-before", "put-copy"):
    # object writes: "put-stream" parks in an output stream to a matching key after half of
    # its first write, "put-before" before a put_file to a matching URL, "put-copy" after a
    # copy onto a matching key
    import mds.core.storage as storage
    import mds.planner.runtime.upload as upload

    class _Stream:
        def __init__(self, real):
            self._real = real

        def write(self, data):
            self._real.write(data[: len(data) // 2])
            _park()
            self._real.write(data[len(data) // 2 :])

        def close(self):
            self._real.close()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._real.close()  # what a pyarrow stream does: complete the upload

    class _Store:
        def __init__(self, real):
            self._real = real

        def open_output_stream(self, key, *args, **kwargs):
            stream = self._real.open_output_stream(key, *args, **kwargs)
            return _Stream(stream) if _AT == "put-stream" and fnmatch.fnmatch(key, _KEY) else stream

        def copy_file(self, src, dest):
            self._real.copy_file(src, dest)
            if _AT == "put-copy" and fnmatch.fnmatch(dest, _KEY):
                _park()

        def __getattr__(self, name):
            return getattr(self._real, name)

    _filesystem, _put_file = storage.filesystem, upload.put_file

    def filesystem(url="s3://"):
        return _Store(_filesystem(url))

    def put_file(local, url):
        if _AT == "put-before" and fnmatch.fnmatch(url.split("://", 1)[1], _KEY):
            _park()
        return _put_file(local, url)

    storage.filesystem, upload.put_file = filesystem, put_file
"""


def interrupt_mds(
    tmp: Path,
    at: str,
    sig: signal.Signals,
    *args: Any,
    parked: Callable[[], Any] = lambda: None,
    timeout: float = 60,
    key: str = "*",
) -> tuple[subprocess.CompletedProcess, Any]:
    """Run `mds ARGS` as a real process, wait until it parks at `at` (the put-* phases: at
    the object `key`, a bucket/key glob), call `parked()` (to look at the disk mid-write),
    send `sig`; return the finished process (text output) and what `parked()` returned."""
    hook = tmp / "fault-hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    ready = hook / f"ready-{at}-{sig.name}"
    ready.unlink(missing_ok=True)
    env = {
        "PYTHONPATH": os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])
    }
    env.update(MDS_FAULT_AT=at, MDS_FAULT_READY=str(ready), MDS_FAULT_KEY=key)
    return signal_mds(
        sig, *args, ready=ready.exists, what=at, parked=parked, timeout=timeout, env=env
    )


def signal_mds(
    sig: signal.Signals,
    *args: Any,
    ready: Callable[[], bool],
    what: str = "the point to signal it at",
    parked: Callable[[], Any] = lambda: None,
    timeout: float = 60,
    env: dict[str, str] | None = None,
    signalled: Callable[[], Any] = lambda: None,
) -> tuple[subprocess.CompletedProcess, Any]:
    """Run `mds ARGS` as a real process (the environment plus `env`), wait until `ready()`
    (polled; e.g. a request held by tests/fault_proxy.py), call `parked()`, send `sig`,
    call `signalled()` (e.g. release the held request); return the finished process (text output) and what `parked()` returned. Every wait
    is bounded by `timeout`, and the process is killed if it outlives the test's wait."""
    full = dict(os.environ)
    full.update(env or {})
    full.update(COLUMNS="200", NO_COLOR="1")
    proc = subprocess.Popen(
        [str(MDS_BIN), *[str(a) for a in args]],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            if proc.poll() is not None:
                out, err = proc.communicate()
                raise AssertionError(f"mds exited {proc.returncode} before {what}:\n{out}\n{err}")
            if time.monotonic() > deadline:
                raise AssertionError(f"mds never reached {what}")
            time.sleep(0.01)
        seen = parked()
        proc.send_signal(sig)
        signalled()
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), seen


def built_world(tmp_path: Path) -> Path:
    """The world's data root under `tmp_path`, with its index (root/index) and plan
    (root/plan.mds) built."""
    root = tmp_path / "data"
    write_world(root)
    index_world(root)
    plan_world(root)
    return root
