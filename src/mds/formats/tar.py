"""Tar members without extracting them: where each regular file's data lies in the archive,
and WebDataset's grouping of members into samples.

A tar is a sequence of 512-byte headers, each followed by its data padded to 512 bytes,
ended by two zero blocks. ustar, GNU long names ('L') and pax headers ('x', 'g') are read;
other special entries (links, directories) are stepped over. A WebDataset sample is the run
of consecutive members sharing a key: the member's path up to the first dot of its file
name; the rest of the name (after that dot) is the member's extension ("jpg", "json",
"seg.png").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from mds.errors import SourceDataError

__all__ = ["BLOCK", "Member", "Sample", "image_members", "members", "samples", "split_key"]

BLOCK = 512
_REGULAR = (b"0", b"\0", b"7")


@dataclass(frozen=True)
class Member:
    """One regular file of the archive: its name, where its headers start (its long-name or
    pax header, if any), where its data starts and how long the data is (byte offsets in the
    archive)."""

    name: str
    header: int
    offset: int
    size: int

    @property
    def end(self) -> int:
        """Where the next header starts: data end padded to the block."""
        return self.offset + -(-self.size // BLOCK) * BLOCK


@dataclass(frozen=True)
class Sample:
    """A WebDataset sample: its key and its members by extension."""

    key: str
    members: dict[str, Member]

    @property
    def start(self) -> int:
        return min(m.header for m in self.members.values())

    @property
    def end(self) -> int:
        return max(m.end for m in self.members.values())


def _octal(field: bytes, where: str) -> int:
    if field and field[0] & 0x80:  # GNU base-256 for sizes of 8 GiB and more
        value = int.from_bytes(field[1:], "big")
        return value
    text = field.replace(b"\0", b" ").strip()
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        raise SourceDataError(f"{where}: tar header field {text!r} is not an octal number") from None


def _pax(data: bytes, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(data[pos:space])
        except ValueError:
            raise SourceDataError(f"{where}: malformed pax header") from None
        if length <= 0:
            break
        record = data[space + 1 : pos + length - 1]
        key, _, value = record.partition(b"=")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        pos += length
    return out


def members(read, start: int, end: int | None, where: str) -> Iterator[Member]:
    """The regular-file members whose headers lie in [start, end) (`end` None: to the
    archive's end blocks). `read(offset, size)` returns the archive's bytes there (fewer at
    the end of the file). Data is read only for long-name and pax entries."""
    pos = start
    long_name: str | None = None
    pax: dict[str, str] = {}
    first = start  # where the current entry's first (long-name or pax) header lies
    while end is None or pos < end:
        header = read(pos, BLOCK)
        if len(header) < BLOCK:
            if len(header) == 0 and end is None:
                return
            raise SourceDataError(f"{where}: tar archive cut off at byte {pos + len(header)}")
        if header == bytes(BLOCK):
            return
        checksum = _octal(header[148:156], where)
        if checksum != sum(header[:148]) + 8 * 32 + sum(header[156:]):
            raise SourceDataError(f"{where}: byte {pos}: not a tar header (checksum mismatch)")
        size = _octal(header[124:136], where)
        kind = header[156:157]
        data = pos + BLOCK
        nxt = data + -(-size // BLOCK) * BLOCK
        if long_name is None and not pax and kind in (b"L", b"x"):
            first = pos
        if kind == b"L":
            long_name = read(data, size).rstrip(b"\0").decode("utf-8", "replace")
        elif kind in (b"x", b"g"):
            if kind == b"x":
                pax = _pax(read(data, size), where)
        else:
            if kind in _REGULAR:
                name = pax.get("path") or long_name
                if name is None:
                    name = header[0:100].rstrip(b"\0").decode("utf-8", "replace")
                    prefix = header[345:500].rstrip(b"\0").decode("utf-8", "replace")
                    if header[257:262] == b"ustar" and prefix:
                        name = f"{prefix}/{name}"
                if "size" in pax:
                    size = int(pax["size"])
                    nxt = data + -(-size // BLOCK) * BLOCK
                if size and len(read(data + size - 1, 1)) != 1:
                    raise SourceDataError(f"{where}: tar archive cut off inside {name}")
                yield Member(name, first if (long_name is not None or pax) else pos, data, size)
            long_name, pax = None, {}
        pos = nxt


def split_key(name: str) -> tuple[str, str]:
    """WebDataset's (key, extension) of a member name: cut at the first dot of the file name."""
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1 :]


def samples(items: Iterable[Member], where: str = "tar") -> Iterator[Sample]:
    """Group consecutive members by key, in archive order (a key that comes back later is a
    new sample, as WebDataset reads it). Two members of one sample with the same extension
    are refused: which one the sample means would be a guess."""
    key: str | None = None
    group: dict[str, Member] = {}
    for m in items:
        k, ext = split_key(m.name)
        if k != key and group:
            yield Sample(key, group)  # type: ignore[arg-type]
            group = {}
        key = k
        if ext.lower() in group:
            raise SourceDataError(
                f"{where}: sample {k!r} has two members with extension {ext.lower()!r} "
                f"({group[ext.lower()].name}, {m.name})"
            )
        group[ext.lower()] = m
    if group:
        yield Sample(key, group)  # type: ignore[arg-type]


def image_members(sample: Sample, extensions: tuple[str, ...]) -> list[tuple[str, Member]]:
    """(extension, member) of a sample's images: members whose extension is one of
    `extensions` or ends in ".<one of them>" ("0.jpg" is a "jpg"), ordered by that
    extension's place in `extensions`, then by the member's extension as a string ("0.jpg" <
    "1.jpg" < "10.jpg" < "2.jpg": number them with zero padding). The index and the
    executor both take a sample's images in this order."""
    found = []
    for ext, member in sample.members.items():
        for rank, want in enumerate(extensions):
            if ext == want or ext.endswith("." + want):
                found.append((rank, ext, member))
                break
    return [(ext, m) for _, ext, m in sorted(found, key=lambda t: (t[0], t[1]))]
