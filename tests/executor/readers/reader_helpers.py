"""What the readers' tests share (tests/executor/readers/conftest.py puts this folder on
sys.path): a reader of a file, the sample data, line locations as the index records them,
and payload comparisons."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import zstandard

from mds.core.lru import LRU
from mds.executor.readers import open_reader

SAMPLE = Path(__file__).resolve().parents[3] / "sample_data"


def line_spans(data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(line number, byte offset, byte length) of every non-blank line, as the index has them."""
    rows, offsets, lengths = [], [], []
    position = 0
    for number, line in enumerate(data.split(b"\n")):
        if line.strip():
            rows.append(number)
            offsets.append(position)
            lengths.append(len(line))
        position += len(line) + 1
    return (np.array(x, dtype=np.int64) for x in (rows, offsets, lengths))  # type: ignore[return-value]


def unzstd(data: bytes) -> bytes:
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
    return reader.read()


def reader_for(fmt, path, kind="text", column="text", blocks=None, companion=None, display=None):
    return open_reader(
        fmt,
        Path(path),
        payload_kind=kind,
        column=column,
        companion=companion,
        blocks=LRU(max_bytes=64 << 20) if blocks is None else blocks,
        display=display or Path(path).name,
    )


def shuffled_with_repeats(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.permutation(n), rng.integers(0, n, n // 3 + 1)]).astype(np.int64)


def assert_payloads_equal(got: list, expected: list) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        if isinstance(e, str):
            assert g == e
        else:
            assert isinstance(g, np.ndarray) and g.ndim == 1 and g.dtype.kind in "iu"
            assert g.tolist() == list(e)


def fetch_all(reader, order, offsets=None, lengths=None):
    try:
        if offsets is None:
            return reader.fetch(order, None, None)
        return reader.fetch(order, offsets, lengths)
    finally:
        reader.close()


CACHES = {"warm": lambda: LRU(max_bytes=64 << 20), "tiny": lambda: LRU(max_bytes=1)}


def count_calls(monkeypatch, owner, name: str, counted=lambda *a, **kw: True) -> list:
    calls: list = []
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        if counted(*args, **kwargs):
            calls.append(args)
        return inner(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
    return calls


def reopen_fetch(open_one, fetch_args, times: int = 3) -> list:
    """Open, fetch and close the same file `times` times, as an evicted handle would be."""
    out = []
    for _ in range(times):
        reader = open_one()
        out.append(reader.fetch(*fetch_args))
        reader.close()
    return out
