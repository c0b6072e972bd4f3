"""Tar members without extraction, against Python's tarfile, and WebDataset's samples."""

from __future__ import annotations

import io
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mds.errors import SourceDataError
from mds.formats.tar import image_members, members, samples, split_key


def _tar(entries, fmt=tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in entries:
            if data is None:
                info = tarfile.TarInfo(name)
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
                continue
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _read(data: bytes):
    return lambda offset, n: data[offset : offset + n]


names = st.text(alphabet="abcdefgh/._-é", min_size=1, max_size=140).filter(
    lambda s: not s.startswith("/") and "//" not in s and not s.endswith("/") and s not in (".", "..")
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(names, st.binary(max_size=1500)), min_size=0, max_size=8),
    st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT]),
)
def test_members_match_tarfile(entries, fmt) -> None:
    try:
        data = _tar(entries, fmt)
    except ValueError:  # a name USTAR cannot hold
        return
    got = list(members(_read(data), 0, None, "t.tar"))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        want = [i for i in tar.getmembers() if i.isfile()]
    assert [(m.name, m.offset, m.size) for m in got] == [(i.name, i.offset_data, i.size) for i in want]
    assert [data[m.offset : m.offset + m.size] for m in got] == [d for _, d in entries]
    # each member's range starts at its first header: reading from there finds it again
    for m in got:
        again = list(members(_read(data), m.header, m.end, "t.tar"))
        assert [(x.name, x.offset) for x in again] == [(m.name, m.offset)]


def test_directories_are_stepped_over_and_samples_group_by_key() -> None:
    data = _tar(
        [
            ("d", None),
            ("d/k1.jpg", b"1"),
            ("d/k1.txt", b"t"),
            ("d/k2.0.png", b"2"),
            ("d/k2.1.png", b"3"),
            ("d/k2.txt", b"u"),
            ("d/k1.json", b"{}"),
        ]
    )
    got = list(samples(members(_read(data), 0, None, "t.tar")))
    assert [(s.key, sorted(s.members)) for s in got] == [
        ("d/k1", ["jpg", "txt"]),
        ("d/k2", ["0.png", "1.png", "txt"]),
        ("d/k1", ["json"]),  # a key that comes back is a new sample
    ]
    assert [ext for ext, _ in image_members(got[1], ("png",))] == ["0.png", "1.png"]
    assert split_key("a.b/c.tar.gz") == ("a.b/c", "tar.gz") and split_key("x") == ("x", "")


def test_image_order_follows_the_configured_extensions() -> None:
    data = _tar([("k.png", b"p"), ("k.jpg", b"j"), ("k.10.jpg", b"x"), ("k.2.jpg", b"y")])
    [sample] = samples(members(_read(data), 0, None, "t.tar"))
    assert [e for e, _ in image_members(sample, ("jpg", "png"))] == ["10.jpg", "2.jpg", "jpg", "png"]


def test_two_members_with_one_extension_are_refused() -> None:
    data = _tar([("k.jpg", b"1"), ("k.JPG", b"2")])
    with pytest.raises(SourceDataError, match=r"t.tar: sample 'k' has two members with extension 'jpg'"):
        list(samples(members(_read(data), 0, None, "t.tar"), "t.tar"))


def test_damaged_archives_name_the_byte() -> None:
    data = bytearray(_tar([("a.txt", b"x" * 600), ("b.txt", b"y")]))
    with pytest.raises(SourceDataError, match="t.tar: tar archive cut off inside a.txt"):
        list(members(_read(bytes(data[:1000])), 0, None, "t.tar"))
    with pytest.raises(SourceDataError, match="cut off at byte 1636"):
        list(members(_read(bytes(data[:1636])), 0, None, "t.tar"))
    data[1536 + 10] ^= 0xFF  # the second header's name
    with pytest.raises(SourceDataError, match=r"t.tar: byte 1536: not a tar header"):
        list(members(_read(bytes(data)), 0, None, "t.tar"))
