"""Page headers parsed here walk a column chunk page by page to its last byte and count its
values as the footer does; a header cut short is Truncated, and any bytes at all give a
header, Truncated or Unsupported, never another error. The ULEB128 varint reader reads the
same at one place (`varint`) as at every byte at once (`varints`)."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from builders import uleb as _uleb
from hypothesis import given, settings
from hypothesis import strategies as st

from mds.formats.parquet.footer import chunk_span
from mds.formats.parquet.thrift import (
    DATA_PAGE,
    DATA_PAGE_V2,
    DICTIONARY_PAGE,
    Truncated,
    Unsupported,
    field_int,
    field_struct,
    page_fields,
    varint,
    varints,
)


def _chunk(**writer) -> tuple[bytes, pq.ColumnChunkMetaData]:
    table = pa.table({"t": [[i % 7, i, -i] for i in range(3000)], "s": ["x" * 30] * 3000})
    out = io.BytesIO()
    pq.write_table(table, out, **writer)
    data = out.getvalue()
    col = pq.read_metadata(io.BytesIO(data)).row_group(0).column(0)
    lo, hi = chunk_span(col)
    return data[lo:hi], col


@pytest.mark.parametrize("version", ["1.0", "2.0"])
@pytest.mark.parametrize("dictionary", [True, False])
@pytest.mark.parametrize("statistics", [True, False])
def test_headers_walk_a_chunk_to_its_end(version, dictionary, statistics):
    chunk, col = _chunk(
        data_page_version=version,
        use_dictionary=dictionary,
        write_statistics=statistics,
        data_page_size=2048,
    )
    pos = values = pages = 0
    kinds = set()
    while pos < len(chunk):
        fields, size = page_fields(memoryview(chunk), pos)
        kind = field_int(fields, 1)
        kinds.add(kind)
        if kind == DATA_PAGE:
            values += field_int(field_struct(fields, 5), 1)
        elif kind == DATA_PAGE_V2:
            values += field_int(field_struct(fields, 8), 1)
        pos += size + field_int(fields, 3)
        pages += 1
    assert pos == len(chunk)
    assert values == col.num_values
    assert pages > 2
    assert (DICTIONARY_PAGE in kinds) == dictionary
    assert kinds - {DICTIONARY_PAGE} == {DATA_PAGE if version == "1.0" else DATA_PAGE_V2}


def test_a_header_cut_short_is_truncated():
    chunk, _col = _chunk(write_statistics=True)
    _fields, size = page_fields(memoryview(chunk), 0)
    for n in range(size):
        with pytest.raises(Truncated):
            page_fields(memoryview(chunk[:n]), 0)


def test_long_field_ids_booleans_bytes_and_skipped_fields():
    """Field 100 (its id as a zigzag i16 after a zero delta), a true, a byte, a skipped
    binary, list of i32 and struct; a struct is kept where the PageHeader nests one."""
    header = bytes(
        [0x05, 0xC8, 0x01, 0x0E]  # i32 field 100 = 7 (zigzag 14)
        + [0x11]  # field 101: true
        + [0x13, 0x2A]  # field 102: byte 42
        + [0x18, 0x03, 0x61, 0x62, 0x63]  # field 103: binary "abc", skipped
        + [0x19, 0x25, 0x02, 0x04]  # field 104: list of 2 i32, skipped
        + [0x1C, 0x15, 0x06, 0x00]  # field 105: struct {1: 3}
        + [0x00]
    )
    fields, size = page_fields(memoryview(header), 0)
    assert size == len(header)
    assert fields == {100: 7, 101: True, 102: 42}
    nested = bytes([0x5C, 0x15, 0x06, 0x00, 0x00])  # field 5 (data_page_header): {1: 3}
    assert page_fields(memoryview(nested), 0) == ({5: {1: 3}}, len(nested))


def test_structs_nested_too_deep_are_unsupported():
    deep = bytes([0x1C] * 40 + [0x00] * 41)
    with pytest.raises(Unsupported, match="nesting"):
        page_fields(memoryview(deep), 0)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=80), st.integers(0, 60))
def test_any_bytes_give_a_header_or_a_declared_failure(data, cut):
    chunk, _col = _chunk(write_statistics=True)
    for buf in (data, chunk[:cut] + data):
        try:
            fields, size = page_fields(memoryview(buf), 0)
        except (Truncated, Unsupported):
            continue
        assert 0 < size <= len(buf)
        assert isinstance(fields, dict)



@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 2**32 - 1, 2**35 - 1, 2**63, 2**64 - 1])
def test_varint_reads_uleb128(n):
    data = b"\xaa" + _uleb(n) + b"\x55"
    assert varint(data, 1) == (n, 1 + len(_uleb(n)))
    with pytest.raises(Truncated):
        varint(data[: len(_uleb(n))], 1)
    if len(_uleb(n)) > 5:
        with pytest.raises(Unsupported, match="too long"):
            varint(data, 1, 5)
    with pytest.raises(Unsupported, match="too long"):
        varint(b"\x80" * 10 + b"\x01", 0)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40), st.integers(1, 9))
def test_varints_at_every_byte_are_varint_at_each(data, longest):
    value, length = varints(np.frombuffer(data, np.uint8), longest)
    assert value.size == length.size == len(data)
    for pos in range(len(data)):
        try:
            want, end = varint(data, pos, longest)
        except Truncated:  # read as if zero bytes followed: it ends past the data
            assert length[pos] == 0 or pos + length[pos] > len(data)
            continue
        except Unsupported:
            assert length[pos] == 0
            continue
        assert (int(value[pos]), pos + int(length[pos])) == (want, end)
