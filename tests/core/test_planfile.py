"""The plan file: writer/reader round trip, id encoding, and every corruption the reader catches."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mds.core.planfile import (
    FETCH_COLUMNS,
    FORMAT_VERSION,
    MAGIC,
    ChunkBlocks,
    Fetch,
    PlanReader,
    PlanWriter,
    checksum,
    decode_ids,
    encode_chunk,
    encode_fetch,
    encode_ids,
    width_of,
)
from mds.errors import PlanError

DP, MICRO = 3, 2


@settings(max_examples=40, deadline=None)
@given(width=st.integers(1, 8), data=st.data())
def test_decode_inverts_encode_for_every_width(width, data):
    top = 2 ** (8 * width) - 1
    ids = data.draw(st.lists(st.integers(0, top), max_size=50))
    x = np.array(ids, dtype=np.uint64)
    raw = encode_ids(x, width)
    assert len(raw) == width * len(ids)
    out = decode_ids(raw, width)
    assert out.dtype == np.dtype("<u8")
    assert out.tolist() == ids


@pytest.mark.parametrize("width", range(1, 9))
def test_encode_is_little_endian_and_truncating(width):
    top = 2 ** (8 * width) - 1
    x = np.array([0, 1, top], dtype=np.uint64)
    raw = encode_ids(x, width)
    assert raw[:width] == b"\0" * width
    assert raw[width : 2 * width] == b"\x01" + b"\0" * (width - 1)
    assert raw[2 * width :] == b"\xff" * width
    assert decode_ids(memoryview(raw), width).tolist() == [0, 1, top]
    assert decode_ids(b"", width).tolist() == []


def random_chunks(rng, bounds, dp=DP, micro=MICRO, top=2**20):
    chunks = []
    for a, b in bounds:
        blocks = []
        for _ in range(dp):
            counts = rng.integers(0, 4, (b - a, micro))
            ids = rng.integers(0, top, int(counts.sum())).astype(np.uint64)
            blocks.append((counts, ids))
        chunks.append((a, b, blocks))
    return chunks


def fetch_of(ids: np.ndarray) -> Fetch:
    """Fetch records derived from the ids: three files, JSONL-like byte ranges."""
    ids = ids.astype(np.uint64) % np.uint64(2**40)
    files = (
        [(1, 10 + f, {"path": f"d/f{f}.jsonl", "size": f}) for f in range(3)] if len(ids) else []
    )
    return Fetch(ids % 3, ids // 3, ids % 1000 + 1, ids * 10, ids % 77, files)


def with_fetch(block):
    """A (counts, ids) block completed with fetch records derived from the ids."""
    return block if len(block) == 3 else (*block, fetch_of(block[1]))


def block_bytes(counts, ids, id_width, count_dtype="u1") -> bytes:
    return (
        counts.astype(count_dtype).tobytes()
        + encode_ids(ids, id_width)
        + encode_fetch(fetch_of(ids), len(ids))
    )


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), dp=st.integers(1, 6), top=st.sampled_from([1, 300, 2**40]))
def test_encode_chunk_gives_each_block_as_encoded_alone(seed, dp, top):
    """The chunk-wide encoder: per rank, exactly the counts, ids and fetch part encoded on
    their own (column widths per rank, empty ranks, shared file records)."""
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(dp):
        counts = rng.integers(0, 3, (2, MICRO)) * int(rng.integers(0, 2))  # some ranks empty
        ids = rng.integers(0, top, int(counts.sum()), dtype=np.uint64)
        blocks.append((counts, ids, fetch_of(ids)))
    width = max(1, int(rng.integers(1, 9)))
    ids_top = max((int(b[1].max(initial=0)) for b in blocks), default=0)
    width = max(width, (ids_top.bit_length() + 7) // 8)
    for given_as in (blocks, ChunkBlocks.of(blocks)):
        encoded = encode_chunk(given_as, 2, MICRO, width)
        assert encoded.count_width == 1
        for k, (counts, ids, fetch) in enumerate(blocks):
            alone = (
                counts.astype("u1").tobytes()
                + encode_ids(ids, width)
                + encode_fetch(fetch, len(ids))
            )
            assert encoded.payloads[k] == alone
            assert encoded.checksums[k] == checksum(alone)
    chunk = ChunkBlocks.of(blocks)
    for k, (counts, ids, fetch) in enumerate(blocks):
        c, i, f = chunk[k]
        assert np.array_equal(c, counts) and np.array_equal(i, ids) and f.files == fetch.files


def write_plan(path: Path, chunks, *, id_width=3, sections=None, footer=None):
    writer = PlanWriter(
        path,
        path.with_suffix(".tmp"),
        dp_size=len(chunks[0][2]) if chunks else DP,
        micro_batches=chunks[0][2][0][0].shape[1] if chunks else MICRO,
        id_width=id_width,
    )
    for a, b, blocks in chunks:
        writer.add_chunk(a, b, [with_fetch(block) for block in blocks])
    for name, array in (sections or {}).items():
        writer.add_section(name, array)
    return writer.commit(footer or {"format": "mds-plan", "note": "test"})


@pytest.fixture
def plan(tmp_path):
    rng = np.random.default_rng(1)
    chunks = random_chunks(rng, [(0, 4), (4, 8), (8, 10)])
    sections = {
        "stats": rng.integers(0, 10**12, (10, 9)).astype(np.int64),
        "target": rng.random((4, 3)),
        "small": np.arange(5, dtype=np.uint16),
    }
    path = tmp_path / "plan.mds"
    footer_bytes = write_plan(path, chunks, sections=sections)
    return path, chunks, sections, footer_bytes


def test_round_trip(plan):
    path, chunks, sections, footer_bytes = plan
    assert not path.with_suffix(".tmp").exists()  # renamed into place
    with PlanReader(path) as r:
        assert r.footer["format"] == "mds-plan" and r.footer["note"] == "test"
        assert r.footer_bytes == footer_bytes
        assert r.plan_id == hashlib.blake2b(footer_bytes, digest_size=16).hexdigest()
        assert (r.dp, r.micro, r.id_width) == (DP, MICRO, 3)
        assert r.steps == 10
        assert [c[:2] for c in r.chunks] == [(0, 4), (4, 8), (8, 10)]
        assert [c[4] for c in r.chunks] == [1, 1, 1]  # counts < 256: one byte each
        for c, (a, _b, blocks) in enumerate(chunks):
            for rank, (counts, ids) in enumerate(blocks):
                block = r.rank_chunk(c, rank)
                assert block.step_start == a
                assert np.array_equal(block.counts, counts)
                assert block.counts.dtype == np.int64
                assert np.array_equal(block.ids, ids)
                expected = fetch_of(ids)
                for name in FETCH_COLUMNS:
                    assert getattr(block.fetch, name).tolist() == getattr(expected, name).tolist()
                assert block.fetch.files == expected.files
        for name, array in sections.items():
            got = r.section(name)
            assert got.dtype == array.dtype.newbyteorder("<") and np.array_equal(got, array)
        assert [r.chunk_of(s) for s in range(10)] == [0] * 4 + [1] * 4 + [2] * 2
    layout = json.loads(footer_bytes)["layout"]
    assert set(layout["sections"]) == set(sections)


def test_file_layout_follows_the_spec(plan):
    path, chunks, _, footer_bytes = plan
    data = path.read_bytes()
    assert data[:8] == MAGIC
    assert struct.unpack_from("<II", data, 8) == (FORMAT_VERSION, 0)
    offset, size, digest, magic = struct.unpack("<QQ8s8s", data[-32:])
    assert magic == MAGIC and data[offset : offset + size] == footer_bytes
    assert digest == checksum(footer_bytes)
    assert offset + size + 32 == len(data)
    layout = json.loads(footer_bytes)["layout"]
    a, b, dir_offset, dir_sum, width = layout["chunks"][0]
    assert (a, b, width) == (0, 4, 1)
    directory = data[dir_offset : dir_offset + 24 * DP]
    assert checksum(directory).hex() == dir_sum
    off, n, block_sum = struct.unpack_from("<QQ8s", directory, 0)
    counts, ids = chunks[0][2][0]
    expected = block_bytes(counts, ids, 3)
    assert data[off : off + n] == expected and checksum(expected) == block_sum
    # the fetch part: five column widths, the file-record JSON's size, the columns, the JSON
    fetch = data[off + counts.size + 3 * len(ids) : off + n]
    widths = struct.unpack_from("<5B", fetch)
    assert widths == tuple(width_of(c) for c in fetch_of(ids).columns())
    (json_size,) = struct.unpack_from("<Q", fetch, 8)
    assert json.loads(fetch[-json_size:]) == [
        [1, 10 + f, {"path": f"d/f{f}.jsonl", "size": f}] for f in range(3)
    ]
    assert len(fetch) == 16 + sum(widths) * len(ids) + json_size


@pytest.mark.parametrize(("peak", "width"), [(255, 1), (256, 2), (65535, 2), (65536, 4)])
def test_count_width_is_the_smallest_that_fits_the_chunk(tmp_path, peak, width):
    rng = np.random.default_rng(peak)
    big = (np.array([[peak], [1]]), rng.integers(0, 2**63, peak + 1).astype(np.uint64))
    small = (np.array([[0], [2]]), np.array([5, 2**63 + 7], dtype=np.uint64))
    path = tmp_path / "p.mds"
    one = (np.array([[1]]), small[1][:1])
    none = (np.array([[0]]), small[1][:0])
    write_plan(path, [(0, 2, [big, small]), (2, 3, [one, none])], id_width=8)
    with PlanReader(path) as r:
        assert [c[4] for c in r.chunks] == [width, 1]
        assert np.array_equal(r.rank_chunk(0, 0).counts, big[0])
        assert np.array_equal(r.rank_chunk(0, 0).ids, big[1])
        assert r.rank_chunk(0, 1).ids.tolist() == [5, 2**63 + 7]
        assert r.rank_chunk(1, 0).ids.tolist() == [5]
        assert r.rank_chunk(1, 1).counts.tolist() == [[0]]


def test_an_empty_plan(tmp_path):
    path = tmp_path / "p.mds"
    write_plan(path, [])
    with PlanReader(path) as r:
        assert r.steps == 0 and r.chunks == []
        with pytest.raises(PlanError, match="step 0 is outside the plan's 0 steps"):
            r.chunk_of(0)


def test_checksums_ending_in_nul_bytes(tmp_path):
    """The directory stores each block checksum in an 8-byte field; one ending in 0x00 must
    still verify (numpy's "S8" drops trailing NULs on read; 1 block in 256 is affected)."""
    found = []
    for seed in range(5000):
        counts = np.array([[1]])
        ids = np.array([seed], dtype=np.uint64)
        data = block_bytes(counts, ids, 2)
        if checksum(data)[-1] == 0:
            found.append((counts, ids))
            if len(found) == 2:
                break
    assert len(found) == 2
    path = tmp_path / "p.mds"
    write_plan(
        path,
        [
            (0, 1, [found[0], (np.array([[0]]), np.array([], np.uint64))]),
            (1, 2, [found[1], found[1]]),
        ],
        id_width=2,
    )
    with PlanReader(path) as r:
        assert r.micro == 1
        assert r.rank_chunk(0, 0).ids.tolist() == found[0][1].tolist()
        assert r.rank_chunk(1, 1).ids.tolist() == found[1][1].tolist()


def test_abort_removes_the_temporary_file(tmp_path):
    path = tmp_path / "p.mds"
    writer = PlanWriter(path, tmp_path / "p.tmp", dp_size=1, micro_batches=1, id_width=1)
    writer.add_chunk(0, 1, [with_fetch((np.array([[1]]), np.array([7], np.uint64)))])
    assert (tmp_path / "p.tmp").exists()
    writer.abort()
    assert not (tmp_path / "p.tmp").exists() and not path.exists()
    writer.abort()  # idempotent


# --- errors and corruption -------------------------------------------------------------------


def read_all(path):
    with PlanReader(path) as r:
        for c in range(len(r.chunks)):
            for rank in range(r.dp):
                r.rank_chunk(c, rank)
        for name in r.sections:
            r.section(name)


def error_of(path) -> str:
    with pytest.raises(PlanError) as err:
        read_all(path)
    return str(err.value)


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def layout_of(path):
    data = path.read_bytes()
    offset, size, _, _ = struct.unpack("<QQ8s8s", data[-32:])
    return json.loads(data[offset : offset + size])["layout"], offset


def test_flipped_byte_in_a_rank_block(plan):
    path = plan[0]
    layout, _ = layout_of(path)
    dir_offset = layout["chunks"][1][2]
    off, n, _ = struct.unpack_from("<QQ8s", path.read_bytes(), dir_offset + 24 * 2)
    flip(path, off + n - 1)
    msg = error_of(path)
    assert "chunk 1 rank 2: checksum mismatch" in msg and str(path) in msg
    with PlanReader(path) as r:  # other blocks still read fine
        r.rank_chunk(1, 1)
        r.rank_chunk(0, 2)


def test_flipped_byte_in_a_directory(plan):
    path = plan[0]
    layout, _ = layout_of(path)
    flip(path, layout["chunks"][2][2] + 3)
    assert "chunk 2: directory checksum mismatch" in error_of(path)


def test_flipped_byte_in_a_section(plan):
    path = plan[0]
    layout, _ = layout_of(path)
    flip(path, layout["sections"]["target"]["offset"] + 5)
    assert "section 'target': checksum mismatch" in error_of(path)


def test_flipped_byte_in_the_footer(plan):
    path = plan[0]
    _, offset = layout_of(path)
    flip(path, offset + 10)
    assert "footer checksum mismatch" in error_of(path)


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.999])
def test_truncated_file(plan, keep):
    path = plan[0]
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    msg = error_of(path)
    assert "truncated" in msg or "corrupt" in msg


def test_cut_to_almost_nothing(plan):
    path = plan[0]
    path.write_bytes(path.read_bytes()[:20])
    assert "not an mds plan (file too short; truncated?)" in error_of(path)


def error_with_version(path: Path, version: int) -> str:
    """The reader's error for the plan at `path` with its header's format version set."""
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 8, version)
    path.write_bytes(bytes(data))
    return error_of(path)


def test_newer_version(plan):
    msg = error_with_version(plan[0], 99)
    assert "plan format version 99 is newer than this mds supports (2)" in msg and "upgrade" in msg


def test_version_one_says_to_re_plan(plan):
    """Format 1 blocks held only sample ids; this mds needs the fetch records of format 2."""
    msg = error_with_version(plan[0], 1)
    assert "plan format version 1 is from an older mds" in msg and "re-plan with `mds plan`" in msg


def test_version_zero(plan):
    assert "invalid plan format version 0" in error_with_version(plan[0], 0)


def test_wrong_magic(plan, tmp_path):
    path = plan[0]
    data = path.read_bytes()
    path.write_bytes(b"PAR1" + data[4:])
    assert "not an mds plan (bad magic)" in error_of(path)
    other = tmp_path / "parquet.mds"
    other.write_bytes(b"PAR1" + b"\0" * 100 + b"PAR1")
    assert "bad magic" in error_of(other)


def test_trailer_without_magic(plan):
    path = plan[0]
    data = path.read_bytes()
    path.write_bytes(data[:-8] + b"XXXXXXXX")
    assert "truncated or corrupt plan (no trailer)" in error_of(path)


def test_trailer_pointing_outside(plan):
    path = plan[0]
    data = bytearray(path.read_bytes())
    struct.pack_into("<Q", data, len(data) - 32, len(data))
    path.write_bytes(bytes(data))
    assert "corrupt plan trailer" in error_of(path)


def test_missing_file(tmp_path):
    with pytest.raises(PlanError, match="cannot open plan"):
        PlanReader(tmp_path / "nope.mds")


def test_step_rank_and_chunk_outside_the_plan(plan):
    path = plan[0]
    with PlanReader(path) as r:
        for step in (-1, 10, 10**9):
            with pytest.raises(PlanError, match=f"step {step} is outside the plan's 10 steps"):
                r.chunk_of(step)
        for rank in (-1, DP):
            with pytest.raises(
                PlanError, match=f"DP rank {rank} is outside the plan's dp_size {DP}"
            ):
                r.rank_chunk(0, rank)
        with pytest.raises(PlanError, match="chunk 3 does not exist"):
            r.rank_chunk(3, 0)
        with pytest.raises(PlanError, match="corrupt plan footer \\(section 'nope'"):
            r.section("nope")


def rewrite_footer(path: Path, change) -> None:
    """Replace the footer with `change(footer)` and a valid checksum (a crafted file)."""
    data = path.read_bytes()
    offset, size, _, _ = struct.unpack("<QQ8s8s", data[-32:])
    footer = json.loads(data[offset : offset + size])
    change(footer)
    new = json.dumps(footer).encode()
    path.write_bytes(
        data[:offset] + new + struct.pack("<QQ8s8s", offset, len(new), checksum(new), MAGIC)
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f.pop("layout"), "corrupt plan footer"),
        (lambda f: f["layout"].update(dp_size=0), "corrupt plan footer (bad layout)"),
        (lambda f: f["layout"].update(id_width=9), "bad layout"),
        (lambda f: f["layout"]["chunks"][1].__setitem__(4, 3), "bad layout"),
        (lambda f: f["layout"]["chunks"][1].__setitem__(1, 4), "bad layout"),
        (
            lambda f: f["layout"]["chunks"][0].__setitem__(2, 10**12),
            "a reference points outside the file",
        ),
        (
            lambda f: f["layout"]["chunks"][0].__setitem__(3, "00" * 8),
            "chunk 0: directory checksum mismatch",
        ),
        (
            lambda f: f["layout"]["sections"]["stats"].update(shape=[3, 3]),
            "section 'stats': corrupt shape",
        ),
        (lambda f: f["layout"]["sections"]["stats"].update(dtype="|O"), "corrupt shape"),
        (lambda f: f["layout"].update(micro_batches=3), "corrupt block"),
    ],
)
def test_crafted_footers(plan, change, message):
    path = plan[0]
    rewrite_footer(path, change)
    assert message in error_of(path)


def test_nonzero_header_flags_refused(plan) -> None:
    path = plan[0]
    data = bytearray(path.read_bytes())
    data[12:16] = (0x80).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(PlanError, match="unknown plan header flags 0x80"):
        PlanReader(path)


def test_verify_sections_names_the_corrupt_one(plan) -> None:
    path, _chunks, sections, _footer = plan
    with PlanReader(path) as reader:
        reader.verify_sections()
        offset = int(reader.sections["target"]["offset"])
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))
    with PlanReader(path) as reader, pytest.raises(PlanError, match="section 'target': checksum"):
        reader.verify_sections()
