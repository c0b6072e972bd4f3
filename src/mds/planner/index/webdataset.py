"""Scan WebDataset tar shards (docs/vision.md): one row per sample, its byte range in the
tar, its images' sizes from their headers and its text's tokens.

The tar is read front to back in large buffered reads (a range request per buffer for an
object); a member's data is looked at only when it is an image (its header) or the text.
A sample's images are its members whose extension is one of `images` or ends in
".<one of them>" ("0.jpg" is a "jpg"), ordered by that extension's place in `images`,
then by the member's extension as a string ("0.jpg" < "1.jpg" < "10.jpg" < "2.jpg":
number them with zero padding). The executor follows the same order.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from mds.core import storage
from mds.errors import SourceDataError
from mds.formats.tar import Sample, image_members, members, samples
from mds.planner.index.discover import DataFile
from mds.planner.index.images import BadImage, ImageRows, ImageScan, bad_image, image_frame, size_of
from mds.planner.index.scan import ScanContext

__all__ = ["Window", "image_members", "scan_webdataset"]

CHECK_EVERY = 256  # samples between looks at the stop flag


class Window:
    """Reads of a file at increasing offsets served from one large buffer: a read outside
    the buffer refills it from there. `raw(offset, n)` reads the file; `into(offset, view)`,
    if given, reads into the view and returns how many bytes it read, so the buffer is
    allocated once."""

    def __init__(
        self,
        raw: Callable[[int, int], bytes],
        size: int,
        chunk: int,
        into: Callable[[int, memoryview], int] | None = None,
    ):
        self.raw, self.size, self.chunk, self.into = raw, size, chunk, into
        self.start, self.length = 0, 0
        self.mem = memoryview(bytearray(chunk) if into is not None else b"")
        self.fetched = 0  # bytes read from the file so far

    def read(self, offset: int, n: int) -> bytes:
        return bytes(self.view(offset, n))

    def view(self, offset: int, n: int) -> memoryview:
        """The bytes [offset, offset + n) (fewer at the end of the file), valid until the
        next call."""
        at = offset - self.start
        if 0 <= at and at + n <= self.length:
            return self.mem[at : at + n]
        n = max(0, min(n, self.size - offset))
        if n >= self.chunk:
            self.fetched += n
            return memoryview(self.raw(offset, n))
        want = min(self.chunk, self.size - offset)
        if self.into is not None:
            self.length = self.into(offset, self.mem[:want])
        else:
            self.mem = memoryview(self.raw(offset, want))
            self.length = len(self.mem)
        self.start = offset
        self.fetched += self.length
        return self.mem[: min(n, self.length)]


def _opened(file: DataFile):
    """(read function, read-into function or None, size, closer) of a local file or an
    object."""
    if storage.is_url(file.path):
        url = str(file.path)
        handle = storage.open_input(url)
        try:
            size = handle.size()
        except OSError as exc:
            handle.close()
            raise storage.failure(url, "stat", exc) from None
        read = lambda off, n: storage.read_exact(handle, url, size, off, n)  # noqa: E731
        return read, None, size, handle.close
    try:
        fd = os.open(file.path, os.O_RDONLY)
    except OSError as exc:
        raise SourceDataError(f"{file.rel}: cannot open ({exc.strerror or exc})") from None
    size = os.fstat(fd).st_size

    def pread(offset: int, n: int) -> bytes:
        out = os.pread(fd, n, offset)
        while len(out) < n:  # short reads: a pipe-like filesystem
            more = os.pread(fd, n - len(out), offset + len(out))
            if not more:
                raise SourceDataError(f"{file.rel}: file shrank while it was read")
            out += more
        return out

    def pread_into(offset: int, view: memoryview) -> int:
        got = 0
        while got < len(view):
            n = os.preadv(fd, [view[got:]], offset + got)
            if n == 0:
                raise SourceDataError(f"{file.rel}: file shrank while it was read")
            got += n
        return got

    return pread, pread_into, size, lambda: os.close(fd)


def _text(window: Window, sample: Sample, text: str, file: DataFile) -> str:
    json_key = text[5:] if text.startswith("json:") else None
    ext = "json" if json_key is not None else text.lower()
    member = sample.members.get(ext)
    where = f"{file.rel} sample {sample.key!r}"
    if member is None:
        raise SourceDataError(f"{where}: no .{ext} member (the text, `text` = {text!r})")
    try:
        value = window.read(member.offset, member.size).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceDataError(f"{where}: .{ext} member is not UTF-8 ({exc.reason})") from None
    if json_key is None:
        return value
    try:
        data = json.loads(value)
    except ValueError as exc:
        raise SourceDataError(f"{where}: .json member is not JSON ({exc})") from None
    got = data.get(json_key) if isinstance(data, dict) else None
    if not isinstance(got, str):
        raise SourceDataError(
            f"{where}: .json member has no string at key {json_key!r} (got {got!r})"
        )
    return got


def scan_webdataset(file: DataFile, ctx: ScanContext) -> ImageScan:
    spec = ctx.spec
    assert spec.images is not None and spec.text is not None
    extensions = spec.images.extensions
    raw, into, size, close = _opened(file)
    rows = ImageRows()
    keys: list[str] = []
    reported = 0
    try:
        window = Window(raw, size, ctx.chunk_bytes, into)
        for i, sample in enumerate(samples(members(window.read, 0, None, file.rel), file.rel)):
            if i % CHECK_EVERY == 0:
                ctx.check_stop()
                ctx.advance(window.fetched - reported)
                reported = window.fetched
            sizes = []
            try:
                for _ext, m in image_members(sample, extensions):
                    sizes.append(size_of(window.view(m.offset, m.size), m.name))
            except BadImage as exc:
                bad_image(file, f"sample {sample.key!r}", exc, ctx, rows)
                continue
            text = _text(window, sample, spec.text, file)
            start = sample.start
            rows.add(i, text, sizes, start, sample.end - start)
            keys.append(sample.key)
    finally:
        close()
    ctx.advance(window.fetched - reported)
    return image_frame(rows, ctx, lambda i: f"{file.rel} sample {keys[i]!r}", located=True)
