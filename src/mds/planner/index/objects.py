"""A source's files when the data root is an object store prefix (s3://bucket/prefix).

One listing of the prefix (a few requests per thousand objects) gives every key and size;
a source's `path` patterns are matched against the keys relative to the root: a key, a
glob (`*`, `?`, `**` across directories) or a directory prefix (every data object under it).
As on a file system, hidden names (a part starting with ".") and anything inside an mds
index (a prefix holding an mds manifest.json, or this run's output) are never data; a
Megatron .bin needs its .idx.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterable
from pathlib import PurePosixPath

from mds.core import storage
from mds.core.index_manifest import MANIFEST
from mds.errors import ConfigError, SourceDataError
from mds.planner.index.config import SourceSpec
from mds.planner.index.discover import MANIFEST_HEAD, DataFile, is_index_manifest, one_format
from mds.planner.index.layout import (
    Listing,
    detect_format,
    directory_files,
    hidden,
    inside_index,
    megatron_half,
)

__all__ = ["discover_objects", "head", "listing", "relative_key"]


def listing(
    root: str, exclude: Iterable[str] = (), objects: list[tuple[str, int]] | None = None
) -> Listing:
    """Every candidate key under `root` (relative, sorted, with its size): list once per
    build. Keys under
    a prefix of `exclude` (this run's index output) or under any mds index are left out,
    as `discover` leaves out such directories, so an index never ingests itself.
    `objects`: the root's (key, size) list when the caller listed it already."""
    objects = storage.list_objects(root) if objects is None else objects
    keys = [key for key, _size in objects]
    indexes = {
        str(PurePosixPath(k).parent)
        for k in keys
        if PurePosixPath(k).name == MANIFEST
        and is_index_manifest(head(str(storage.join(root, k)), MANIFEST_HEAD))
    }
    for url in exclude:
        rel = relative_key(url, root)
        if rel == "":
            return Listing()
        if rel is not None:
            indexes.add(rel)
    return Listing(
        (
            (k, size)
            for k, size in objects
            if not hidden(k)
            and not any(str(parent) in indexes for parent in PurePosixPath(k).parents)
        ),
        indexes,
    )


def relative_key(url: str, prefix: str) -> str | None:
    """`url` relative to the URL `prefix` ("" when they are the same place), or None when
    `url` is not under `prefix`."""
    url, prefix = str(url).rstrip("/"), str(prefix).rstrip("/")
    if url == prefix:
        return ""
    return url[len(prefix) + 1 :] if url.startswith(prefix + "/") else None


def head(url: str, size: int) -> bytes:
    """The first `size` bytes of the object `url` (one range request, checked whole as
    every object read is: storage.read_exact)."""
    with storage.open_input(url) as f:
        try:
            total = f.size()
        except OSError as exc:
            raise storage.failure(url, "stat", exc) from None
        return storage.read_exact(f, url, total, 0, min(size, total))


def _pattern(glob_text: str) -> re.Pattern[str]:
    """A glob over keys as a regex: `**/` any directories, `*`, `?` and `[...]` within one
    part."""
    out, i = [], 0
    while i < len(glob_text):
        if glob_text.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob_text.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob_text[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob_text[i] == "?":
            out.append("[^/]")
            i += 1
        elif glob_text[i] == "[" and (end := _class_end(glob_text, i)) > 0:
            body = glob_text[i + 1 : end]
            negate = body[:1] == "!"
            body = body[1:] if negate else body
            # As glob: `[!...]` negates, `-` makes a range; a class never matches "/".
            escaped = body.replace("\\", "\\\\").replace("^", "\\^").replace("[", "\\[")
            out.append(f"(?!/)[{'^' if negate else ''}{escaped}]")
            i = end + 1
        else:
            out.append(re.escape(glob_text[i]))
            i += 1
    return re.compile("".join(out))


def _class_end(text: str, i: int) -> int:
    """Where the glob character class opened at `text[i]` ("[") closes, or -1 if it does
    not (then "[" is a literal character, as in glob)."""
    j = i + 1
    if j < len(text) and text[j] == "!":
        j += 1
    if j < len(text) and text[j] == "]":  # a "]" first is a member, not the end
        j += 1
    end = text.find("]", j)
    return -1 if end < 0 or "/" in text[i:end] else end


def discover_objects(
    spec: SourceSpec, root: str, keys: Listing | Iterable[str]
) -> list[DataFile]:
    """The source's objects among `keys` (the root's `listing`), sorted; errors name the
    pattern. A key is that object; a Megatron prefix its pair; a directory prefix its data
    objects (a save_to_disk directory's from its state.json), decided as on a file system
    by index/layout.py; only a pattern that names none of these is a glob."""
    where = f"source '{spec.name}': "
    keys = Listing.of(keys)
    found: dict[str, DataFile] = {}
    for raw in spec.paths:
        pattern = raw.strip("/")
        if PurePosixPath(pattern).is_absolute() or ".." in PurePosixPath(pattern).parts:
            raise ConfigError(f"{where}`path` {raw!r} must be relative to the data root {root}")
        # A key, directory prefix or Megatron prefix that exists is meant literally, glob
        # characters or not.
        inside = keys.index_of(pattern)
        if inside is not None:
            raise inside_index(where, raw, f"{root}/{inside}")
        if pattern in keys:
            matches = [pattern]
        elif (half := megatron_half(pattern, keys.__contains__)) is not None:
            matches = [half]
        else:
            matches = _prefix_files(root, pattern, keys)
        if not matches and glob.has_magic(pattern):
            regex = _pattern(pattern)
            matches = [k for k in keys if regex.fullmatch(k)]
        if not matches:
            raise ConfigError(f"{where}`path` {raw!r} matches no objects under {root}")
        for key in matches:
            fmt = spec.format or detect_format(PurePosixPath(key))
            if fmt is None:
                raise ConfigError(
                    f"{where}cannot tell the format of {root}/{key} from its name; set `format`"
                )
            companion = None
            if fmt == "megatron":
                key, companion = _megatron_pair(key, keys, root, where)
            found[key] = DataFile(storage.join(root, key), key, fmt, companion)  # type: ignore[arg-type]
    return one_format(found.values(), where, "objects")


def _prefix_files(root: str, prefix: str, keys: Listing) -> list[str]:
    """The data objects under the directory prefix `prefix` (keys relative to `root`)."""
    inside = keys.under(prefix)
    if not len(inside):
        return []
    place = f"{root}/{prefix}"
    read = lambda rel: head(f"{place}/{rel}", inside.size(rel))  # noqa: E731
    return [f"{prefix}/{rel}" for rel in directory_files(place, inside, read)]


def _megatron_pair(key: str, keys: Listing, root: str, where: str) -> tuple[str, str]:
    """The .bin key of a Megatron dataset and the URL of its .idx; both must exist."""
    path = PurePosixPath(key)
    ext = path.suffix if path.suffix.lower() in (".bin", ".idx") else ""
    prefix = key[: len(key) - len(ext)]
    for needed in (prefix + ".bin", prefix + ".idx"):
        if needed not in keys:
            raise SourceDataError(
                f"{where}{root}/{needed}: missing (a Megatron dataset needs both .bin and .idx)"
            )
    return prefix + ".bin", str(storage.join(root, prefix + ".idx"))
