"""File names that are also glob patterns, each next to a decoy the pattern would match:
what a scanner reads for `p[1].parquet` must be that file, never `p1.parquet`.

A plain module (tests/conftest.py puts tests/ on sys.path): `from literal_names import ...`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

# (literal stem, a decoy stem its glob reading matches; None where none can)
NAMES = [
    ("p[1]", "p1"),
    ("p[!x]", "py"),
    ("p*", "pz"),
    ("p?", "pq"),
    ("p{1,2}", None),
    ("with space", None),
    ("ünï cødé ✓", None),
    ("a]b[c", None),
]
IDS = [stem for stem, _ in NAMES]


def write_with_decoy(
    directory: Path, stem: str, decoy: str | None, ext: str, write: Callable[[Path, int], None]
) -> Path:
    """`stem + ext` with the value 2 and, where there is one, the decoy with 5; returns the
    literal file's path. `write(path, n)` writes two rows of `n` tokens each (the same row
    count, so only the values tell the files apart)."""
    directory.mkdir(parents=True, exist_ok=True)
    if decoy is not None:
        write(directory / f"{decoy}{ext}", 5)
    path = directory / f"{stem}{ext}"
    write(path, 2)
    return path
