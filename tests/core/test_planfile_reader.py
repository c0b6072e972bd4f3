"""The plan reader: a written plan read back whole, and every corruption it catches."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from planfile_builders import (
    DP,
    MICRO,
    fetch_of,
    footer_json,
    footer_text,
    stored_footer,
    write_plan,
    written_plan,
)

from mds.core.planfile import FETCH_COLUMNS, MAGIC, Fetch, checksum
from mds.core.planfile_reader import PlanReader
from mds.errors import PlanError


@pytest.fixture
def plan(tmp_path):
    return written_plan(tmp_path)


@pytest.mark.parametrize("version", [2, 3, 4])
def test_round_trip(tmp_path, version):
    """A plan reads back as written; a version-2 plan (fixed-width columns, file records in
    every block, raw sections) and a version-3 one (file tables on their own, the footer
    plain JSON) still read, to the same samples."""
    path, chunks, sections, footer_bytes = written_plan(tmp_path, version)
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
        assert r.version == version
    layout = json.loads(footer_bytes)["layout"]
    assert set(layout["sections"]) == set(sections)
    codecs = {meta.get("codec") for meta in layout["sections"].values()}
    # Version 4 packs integer sections by column; a float one stays byte planes.
    assert codecs == {2: {None}, 3: {"zstd"}, 4: {"zstd", "columns"}}[version]


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
    return footer_json(data)["layout"], footer_text(data)[0]


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


def test_flipped_byte_in_the_first_file_table_fails_every_chunk(plan):
    """Later chunks' file tables are compressed against the first chunk's: a flipped byte in
    it is caught when any chunk is read, never decoded into other records."""
    path = plan[0]
    layout, _ = layout_of(path)
    off, n, _ = struct.unpack_from("<QQ8s", path.read_bytes(), layout["chunks"][0][2] + 24 * DP)
    flip(path, off + n // 2)
    with PlanReader(path) as r:
        with pytest.raises(PlanError, match="chunk 0 file table: checksum mismatch"):
            r.rank_chunk(2, 1)


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
    assert "plan format version 99 is newer than this mds supports (4)" in msg and "upgrade" in msg


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
    offset, text = footer_text(data)
    footer = json.loads(text)
    change(footer)
    new = stored_footer(json.dumps(footer).encode())
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


def test_a_table_with_the_previous_chunks_bytes_is_checked_but_not_decoded_again(tmp_path):
    """Chunks that read the same files store byte-identical tables: the reader decodes the
    first once, but still reads and checks each chunk's own bytes."""
    files = [(0, f, {"path": f"d/{f}.parquet"}) for f in range(3)]
    rng = np.random.default_rng(5)
    chunks = []
    for a in (0, 2, 4):
        blocks = []
        for _ in range(DP):
            counts = rng.integers(1, 4, (2, MICRO))
            ids = rng.integers(0, 1000, int(counts.sum())).astype(np.uint64)
            zero = np.zeros(len(ids), np.int64)
            blocks.append((counts, ids, Fetch(ids % 3, ids, ids % 7 + 1, zero, zero, files)))
        chunks.append((a, a + 2, blocks))
    path = tmp_path / "plan.mds"
    write_plan(path, chunks)
    with PlanReader(path) as r:
        tables = [bytes(r._directory(c)[DP]["checksum"]) for c in range(3)]
        assert tables[1] == tables[2]  # compressed against the first: equal bytes
        for c, (_a, _b, blocks) in enumerate(chunks):
            for rank, (_counts, ids, fetch) in enumerate(blocks):
                got = r.rank_chunk(c, rank)
                assert np.array_equal(got.ids, ids) and got.fetch.files == files
                assert got.fetch.row.tolist() == fetch.row.tolist()
    layout, _ = layout_of(path)
    off, n, _ = struct.unpack_from("<QQ8s", path.read_bytes(), layout["chunks"][2][2] + 24 * DP)
    flip(path, off + n - 1)
    with PlanReader(path) as r:
        r.rank_chunk(1, 0)
        with pytest.raises(PlanError, match="chunk 2 file table: checksum mismatch"):
            r.rank_chunk(2, 0)
