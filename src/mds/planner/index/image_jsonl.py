"""Scan JSONL (plain or zstd) of image-text lines (docs/vision.md): the `images` key holds
an image path or a list of them, relative to the data root, or s3:// / gs:// URLs; each
image's size is read from the head of its file. Lines are located as for text sources
(byte offset and length in the decompressed stream, blank lines not samples but counted).
"""

from __future__ import annotations

import json

from mds.errors import SourceDataError
from mds.planner.index.discover import DataFile
from mds.planner.index.images import (
    BadImage,
    ImageRows,
    ImageScan,
    bad_image,
    data_root,
    image_frame,
    read_file_size,
)
from mds.planner.index.jsonl_lines import (
    blank_lines,
    line_spans,
    newline_chunks,
    open_jsonl,
    refuse_cr_only,
)
from mds.planner.index.scan import ScanContext

__all__ = ["scan_jsonl_images"]


def _refs(value, where: str, key: str) -> list[str]:
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) and v for v in items):
        raise SourceDataError(
            f"{where}: field `{key}` must be an image path or a list of them, got {value!r}"
        )
    return items


def scan_jsonl_images(file: DataFile, ctx: ScanContext) -> ImageScan:
    spec = ctx.spec
    assert spec.images is not None and spec.text is not None
    key = spec.images.field
    count = spec.length.column if spec.length.kind == "count" else None
    rows = ImageRows(keep={c: [] for c in spec.keep})
    root = data_root(file)
    line0 = 0
    scanned = 0
    raw, stream = open_jsonl(file)
    with raw:
        for base, chunk in newline_chunks(stream, ctx.chunk_bytes):
            ctx.check_stop()
            refuse_cr_only(chunk, file)
            starts, lengths = line_spans(chunk)
            blank = blank_lines(chunk, starts, lengths)
            for k in range(len(starts)):
                if blank[k]:
                    continue
                line = line0 + k
                where = f"{file.rel} line {line + 1}"
                start, length = int(starts[k]), int(lengths[k])
                try:
                    obj = json.loads(chunk[start : start + length])
                except ValueError as exc:
                    raise SourceDataError(f"{where}: not valid JSON ({exc})") from None
                if not isinstance(obj, dict):
                    raise SourceDataError(f"{where}: not a JSON object")
                refs = _refs(obj.get(key), where, key)
                try:
                    sizes = [read_file_size(root, ref) for ref in refs]
                except BadImage as exc:
                    bad_image(file, f"line {line + 1}", exc, ctx, rows)
                    continue
                text = obj.get(spec.text)
                if not isinstance(text, str):
                    raise SourceDataError(
                        f"{where}: field `{spec.text}` must be a string, got {text!r}"
                    )
                rows.add(line, text, sizes, base + start, length)
                if count is not None:
                    n = obj.get(count)
                    if isinstance(n, bool) or not isinstance(n, int):
                        raise SourceDataError(
                            f"{where}: field `{count}` must be an integer token count, got {n!r}"
                        )
                    rows.counts.append(n)
                for c in spec.keep:
                    rows.keep[c].append(obj.get(c))
            line0 += len(starts)
            at = raw.tell()
            ctx.advance(at - scanned)
            scanned = at
    return image_frame(rows, ctx, lambda i: f"{file.rel} line {rows.rows[i] + 1}", located=True)
