"""Content fingerprints: stable for equal content, sensitive where they sample, `full` everywhere."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mds.core.fingerprint import fingerprint, stat_signature
from mds.errors import SourceDataError

MIB = 1 << 20
EDGE, BLOCK, BLOCKS = MIB, 64 << 10, 16  # the sampled layout documented in the module


def _data(size: int, seed: int = 0) -> bytearray:
    return bytearray(((i * 2654435761 + seed) >> 7) & 0xFF for i in range(256)) * (size // 256)


def _sampled_regions(size: int) -> list[tuple[int, int]]:
    span = size - 2 * EDGE - BLOCK
    blocks = [(EDGE + span * i // (BLOCKS - 1), BLOCK) for i in range(BLOCKS)]
    return [(0, EDGE), *blocks, (size - EDGE, EDGE)]


def _unsampled_byte(size: int) -> int:
    regions = _sampled_regions(size)
    for pos in range(EDGE, size - EDGE):
        if not any(start <= pos < start + n for start, n in regions):
            return pos
    raise AssertionError("no unsampled byte")


def _flip(path: Path, pos: int) -> None:
    data = bytearray(path.read_bytes())
    data[pos] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> bytes:
    return bytes(_data(5 * MIB))  # > 4 MiB: sampled reads only part of it


@pytest.mark.parametrize("mode", ["sampled", "full"])
def test_stable_for_equal_content(tmp_path: Path, mode: str) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"hello world" * 100)
    b.write_bytes(b"hello world" * 100)
    os.utime(b, ns=(1, 1))  # the stat does not matter, only the content
    assert fingerprint(a, mode) == fingerprint(b, mode) == fingerprint(str(a), mode)
    assert fingerprint(a, mode).startswith(f"{mode}:")
    assert len(fingerprint(a, mode).split(":")[1]) == 32  # BLAKE2b-128


def test_modes_are_labelled_and_differ(tmp_path: Path) -> None:
    path = tmp_path / "a"
    path.write_bytes(b"x" * 10)
    assert fingerprint(path) == fingerprint(path, "sampled")
    assert fingerprint(path, "sampled") != fingerprint(path, "full")


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty"
    path.write_bytes(b"")
    assert fingerprint(path) == fingerprint(path)


def test_small_file_any_byte_change_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "small"
    path.write_bytes(bytes(_data(64 << 10)))
    before = fingerprint(path)
    _flip(path, 12345)
    assert fingerprint(path) != before


@pytest.mark.parametrize("where", ["head", "block", "tail"])
def test_sampled_changes_when_a_sampled_byte_changes(
    tmp_path: Path, big: bytes, where: str
) -> None:
    path = tmp_path / "big"
    path.write_bytes(big)
    before = fingerprint(path, "sampled")
    regions = _sampled_regions(len(big))
    pos = {"head": 10, "block": regions[7][0] + 100, "tail": len(big) - 3}[where]
    _flip(path, pos)
    assert fingerprint(path, "sampled") != before


def test_sampled_sees_appends_and_truncation(tmp_path: Path, big: bytes) -> None:
    path = tmp_path / "big"
    path.write_bytes(big)
    before = fingerprint(path)
    path.write_bytes(big + b"\0")
    assert fingerprint(path) != before
    path.write_bytes(big[:-1])
    assert fingerprint(path) != before


def test_full_detects_a_change_outside_the_sampled_blocks(tmp_path: Path, big: bytes) -> None:
    path = tmp_path / "big"
    path.write_bytes(big)
    sampled, full = fingerprint(path, "sampled"), fingerprint(path, "full")
    _flip(path, _unsampled_byte(len(big)))
    assert fingerprint(path, "sampled") == sampled  # by design: sampled does not read it
    assert fingerprint(path, "full") != full


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "gone.parquet"
    for mode in ("sampled", "full"):
        with pytest.raises(SourceDataError) as info:
            fingerprint(path, mode)
        assert str(info.value).startswith(f"{path}: cannot read file (")
    with pytest.raises(SourceDataError, match="gone.parquet: cannot stat file"):
        stat_signature(path)


def test_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SourceDataError, match="cannot read file"):
        fingerprint(tmp_path)


def test_stat_signature(tmp_path: Path) -> None:
    path = tmp_path / "a"
    path.write_bytes(b"abc")
    os.utime(path, ns=(5, 123456789))
    assert stat_signature(path) == (3, 123456789)


@pytest.mark.parametrize("mode", ["sampled", "full"])
@pytest.mark.parametrize(
    "size",
    [0, 1, 3 * MIB, 2 * EDGE + BLOCKS * BLOCK, 2 * EDGE + BLOCKS * BLOCK + 1, 9 * MIB + 77],
)
def test_an_opened_objects_fingerprint_from_its_spans_is_the_files(
    tmp_path: Path, size: int, mode: str
) -> None:
    """The ranges `spans` names, read in any order and hashed in order after the size
    (`opened_fingerprints`, as the start-up check reads an object's through its open), give
    the fingerprint of the file; a failed read leaves the object out."""
    import pyarrow as pa

    from mds.core import storage
    from mds.core.fingerprint import opened_fingerprints, spans

    data = bytes(os.urandom(size))
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    if mode == "sampled" and size > 2 * EDGE + BLOCKS * BLOCK:
        assert spans(size, mode) == [(lo, lo + n) for lo, n in _sampled_regions(size)]

    def read_in_order(jobs, fail=()):
        got = {job[3]: storage.read_exact(*job[:4], job[4] - job[3]) for job in reversed(jobs)}
        return iter(None if job[3] in fail else got[job[3]] for job in jobs)

    with pa.OSFile(str(path)) as f:
        objects = {"u": (f, size, mode)}
        assert opened_fingerprints(objects, read_in_order) == {("u", mode): fingerprint(path, mode)}
        if size:
            failed = opened_fingerprints(objects, lambda jobs: read_in_order(jobs, {0}))
            assert failed == {}
