"""Turn a source's `path` patterns into the sorted list of data files it covers.

A pattern is a file, a glob (`**` allowed), a directory (every data file under it), a
Hugging Face `save_to_disk` directory, or a Megatron prefix (`name` for `name.bin`/`name.idx`).

Only regular files are data. Globs and directories skip FIFOs, sockets, devices, hidden files
(temporaries, lock files) and everything inside an mds index (the output directory of this
run, or any directory holding an mds manifest.json), so an index never ingests itself; an
explicit path to any of these is an error naming it.
"""

from __future__ import annotations

import glob
import json
import os
import stat
from collections.abc import Iterable
from operator import attrgetter
from pathlib import Path

from mds.core.index_manifest import FORMAT as INDEX_FORMAT
from mds.core.index_manifest import MANIFEST
from mds.errors import ConfigError, SourceDataError
from mds.planner.index.config import SourceSpec
from mds.planner.index.layout import (
    Listing,
    detect_format,
    directory_files,
    inside_index,
    megatron_half,
)
from mds.planner.index.walk import cat, glob_entries, glob_groups

__all__ = [
    "MANIFEST_HEAD",
    "DataFile",
    "detect_format",
    "discover",
    "is_index_dir",
    "is_index_manifest",
    "one_format",
]

class DataFile:
    """One data file of a source; for Megatron `path` is the .bin and `companion` the .idx.
    `signature`: (size, mtime_ns) from the stat discovery made of it, if it made one (a
    re-index then needs no second stat of an unchanged file). Immutable; equal when path,
    rel, format and companion are. A local file found by discovery keeps its path as a
    string until `path` is asked for: a re-index never asks for an unchanged file's."""

    __slots__ = ("_path", "_text", "companion", "format", "rel", "signature")

    def __init__(
        self,
        path: Path,
        rel: str,
        format: str,
        companion: Path | None = None,
        signature: tuple[int, int] | None = None,
    ):
        self._path, self._text = path, None
        self.rel, self.format, self.companion, self.signature = rel, format, companion, signature

    @classmethod
    def local(
        cls, text: str, rel: str, format: str, companion: Path | None, signature
    ) -> DataFile:
        """A local file by its absolute path's string, made a Path when first asked for."""
        f = object.__new__(cls)  # discovery makes one per file: no __init__ call
        f._path, f._text, f.rel, f.format = None, text, rel, format
        f.companion, f.signature = companion, signature
        return f

    @property
    def path(self) -> Path:
        if self._path is None:
            self._path = Path(self._text)  # type: ignore[arg-type]
        return self._path

    @property
    def text(self) -> str:
        """os.fspath(path), without making the Path."""
        return self._text if self._path is None else os.fspath(self._path)  # type: ignore[return-value]

    def _key(self) -> tuple:
        return (self.path, self.rel, self.format, self.companion)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._key() == other._key()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"DataFile(path={self.path!r}, rel={self.rel!r}, format={self.format!r}, "
            f"companion={self.companion!r}, signature={self.signature!r})"
        )

    def __reduce__(self):
        return (DataFile, (self.path, self.rel, self.format, self.companion, self.signature))


MANIFEST_HEAD = 1 << 20  # bytes of a manifest.json read to tell whether it is an mds index's


def is_index_dir(directory: Path) -> bool:
    """True if `directory` holds an mds manifest.json (its `format` is "mds-index")."""
    try:
        with open(directory / MANIFEST, "rb") as f:
            head = f.read(MANIFEST_HEAD)
    except OSError:
        return False
    return is_index_manifest(head)


def is_index_manifest(head: bytes) -> bool:
    """True if `head`, the first MANIFEST_HEAD bytes of a manifest.json, is an mds index's
    (a damaged one still names the format); shared by directories and object prefixes."""
    if INDEX_FORMAT.encode() not in head:
        return False
    try:
        return json.loads(head).get("format") == INDEX_FORMAT
    except (ValueError, AttributeError):
        return True  # a manifest too long to parse from its head, but it names the format


def _kind(path: Path) -> str | None:
    """None for a regular file (after symlinks), else what it is, for an error message."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return "missing or unreadable"
    if stat.S_ISREG(mode):
        return None
    for test, what in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return what
    return "not a regular file"


class _Resolver:
    """Path.resolve() for many files in few directories, as strings (a Path per call costs
    more than the lstat): each directory is resolved once and a file that is not a symlink
    joins its name to it (a symlink is resolved in full)."""

    def __init__(self) -> None:
        self._dirs: dict[str, str] = {}

    def __call__(self, path: Path | str, link: bool | None = None) -> str:
        """`link`: whether `path` is a symlink, when a stat of it said so already."""
        text = os.fspath(path)
        directory, _, name = text.rpartition("/")
        if not directory or name in ("", ".", ".."):
            directory, name = os.path.split(text)
        if name in ("", ".", "..") or (os.path.islink(text) if link is None else link):
            return os.path.realpath(text)
        parent = self._dirs.get(directory)
        if parent is None:
            parent = self._dirs[directory] = os.path.realpath(directory or ".")
        return cat(parent, name)


class _Excluded:
    """The directories that are never a source: `exclude` plus every mds index, found by
    walking a path's parents up to the data root (each directory checked once)."""

    def __init__(self, root: Path, exclude: Iterable[Path]):
        self.root = root
        self.exclude = {Path(p).resolve() for p in exclude if not Path(p).is_file()}
        self._seen: dict[Path, bool] = {}
        self._answers: dict[Path, Path | None] = {}

    def index_of(self, path: Path) -> Path | None:
        """The index directory `path` is in (or is), else None."""
        if path in self._answers:  # many files share a directory
            return self._answers[path]
        answer = self._answers[path] = self._walk(Path(path).absolute())
        return answer

    def _walk(self, path: Path) -> Path | None:
        for directory in (path, *path.parents):
            if directory not in self._seen:
                self._seen[directory] = directory.resolve() in self.exclude or is_index_dir(
                    directory
                )
            if self._seen[directory]:
                return directory
            if directory == self.root:
                break
        return None


def _expand_dir(
    directory: Path, skip: _Excluded, seen: dict[str, tuple[int, int, bool]]
) -> list[Path]:
    """A directory's data files: its listing, decided by `directory_files` (index/layout.py)
    as an object prefix's is; files inside an mds index are not listed. What the stat of
    each file said goes to `seen` (as _expand's; whether it is a symlink unknown)."""
    entries = []
    for p in sorted(directory.rglob("*")):
        try:
            st = p.stat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and skip.index_of(p.parent) is None:
            entries.append((p.relative_to(directory).as_posix(), st.st_size))
            seen[str(p)] = (st.st_size, st.st_mtime_ns, None)  # type: ignore[assignment]
    files = Listing(entries)

    def read(rel: str) -> bytes:
        try:
            return (directory / rel).read_bytes()
        except OSError as exc:
            raise SourceDataError(f"{directory / rel}: cannot read ({exc.strerror or exc})") from None

    return [directory.joinpath(*rel.split("/")) for rel in directory_files(str(directory), files, read)]


def _check_explicit(full: Path, pattern: str, where: str, skip: _Excluded) -> None:
    """An explicit (glob-free) path must be data: not in an index, not a FIFO or device."""
    inside = skip.index_of(full)
    if inside is not None:
        raise inside_index(where, pattern, str(inside))
    kind = _kind(full)
    if kind not in (None, "a directory"):
        raise SourceDataError(f"{where}{full}: {kind}, not a regular file; mds reads only files")


def _expand(
    pattern: str,
    root: Path,
    where: str = "",
    skip: _Excluded | None = None,
    seen: dict[str, tuple[int, int, bool]] | None = None,
) -> list[Path | str | _Group]:
    """The files `pattern` names. A name that exists is that file or directory, even with
    glob characters in it (`data[1].parquet`); so is a Megatron prefix whose .idx or .bin
    exists; only otherwise is a pattern with glob characters a glob. `seen` collects what
    the stats made on the way said of the files: (size, mtime_ns, is a symlink) of a
    regular file, after symlinks. A glob's regular files that are not symlinks come a
    directory at a time (_Group); its other file matches are strings, the rest Paths."""
    skip = skip or _Excluded(root, ())
    seen = {} if seen is None else seen
    full = Path(pattern) if Path(pattern).is_absolute() else root / pattern
    # A Megatron prefix: `name` for `name.idx` + `name.bin` (either half names the pair,
    # so a missing half is reported as such rather than as "matches no files").
    half = megatron_half(str(full), os.path.isfile) if full.name else None
    literal = full.exists() or half is not None or not glob.has_magic(pattern)
    if full.exists():
        _check_explicit(full, pattern, where, skip)
        matches, dirs = [full], {full} if full.is_dir() else set()
    elif literal:
        matches, dirs = ([Path(half)] if half else []), set()
    else:
        matches, dirs = [], set()
        # Relative to the root, so glob characters in the root's own name stay literal.
        top = "" if Path(pattern).is_absolute() else str(root)
        groups = _glob_groups(pattern, top)
        lstat, fstat, is_link, is_reg = os.lstat, os.stat, stat.S_ISLNK, stat.S_ISREG
        for parent, entries in groups:
            if not entries:  # `**` lists every directory: most match nothing
                continue
            # A regular file is never an index itself: only its directory needs a look.
            kept, regular = skip.index_of(parent) is None, []
            for name, entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False) if entry else lstat(cat(parent, name))
                    if is_reg(st.st_mode):
                        if kept:
                            regular.append((name, st.st_size, st.st_mtime_ns))
                        continue
                    g = cat(parent, name)
                    link = is_link(st.st_mode)
                    if link:
                        st = fstat(g)
                except OSError:
                    continue
                if is_reg(st.st_mode):
                    seen[g] = (st.st_size, st.st_mtime_ns, link)
                    if kept:
                        matches.append(g)
                elif stat.S_ISDIR(st.st_mode) and skip.index_of(g) is None:
                    matches.append(g)
                    dirs.add(g)
            if regular:
                matches.append(_Group(parent, regular))
        if any(m.__class__ is not _Group for m in matches):
            matches = _in_path_order(matches)
    out: list[Path | str | _Group] = []
    for match in matches:
        out.extend(_expand_dir(Path(match), skip, seen) if match in dirs else [match])
    if not out and literal and full.is_dir():
        raise ConfigError(
            f"{where}`path` {pattern!r} is a directory with no data files in it (and no "
            "save_to_disk state.json); point `path` at the files, or set it to a glob"
        )
    return out


class _Group:
    """A glob's regular files (not symlinks) in one directory: `parent`, the directory as
    the glob spells it, and (name, size, mtime_ns) of each, from its directory entry."""

    __slots__ = ("files", "parent")

    def __init__(self, parent: str, files: list[tuple[str, int, int]]):
        self.parent, self.files = parent, files


def _in_path_order(matches: list) -> list:
    """A glob's matches one by one in the order of their paths (glob.glob's, sorted), for a
    glob that matched a symlink or a directory: where a file is reached twice (by a symlink
    to it, or in a directory), the last in that order is the one discovery keeps (its name
    telling the format). Plain files reached twice (through a symlinked directory) have one
    name, so either match gives the same DataFile, and their order does not matter."""
    order = []
    for m in matches:
        if m.__class__ is _Group:
            order.extend((cat(m.parent, f[0]), _Group(m.parent, [f])) for f in m.files)
        else:
            order.append((m, m))
    order.sort(key=_first)
    return [m for _, m in order]


def _first(pair: tuple[str, object]) -> str:
    return pair[0]


def _glob_groups(pattern: str, top: str) -> list[tuple[str, list]]:
    """The glob's matches under `top` ("" for an absolute pattern) as (directory path,
    [(name, entry or None), ...]), in glob's order: a directory at a time where the pattern's
    last part is a plain glob (walk.glob_groups), else each match on its own."""
    groups = glob_groups(pattern, top)
    if groups is not None:
        return [(cat(top, d) if d else top, found) for d, found in groups]
    out = []
    for g, entry in glob_entries(pattern, top):
        full = cat(top, g)
        # os.path.dirname of an absolute POSIX path (a directory named the same, if
        # spelled differently: "a/" for "a//b")
        cut = full.rindex("/")
        out.append((full[:cut] or "/", [(full[cut + 1 :], entry)]))
    return out


def _place(directory: str, inside: str, cut: int) -> tuple[str, str] | None:
    """(resolved directory, its path relative to the root), each with a trailing "/", of a
    non-empty directory inside the root (`inside`: the root with a trailing separator, `cut`
    its length); None otherwise. A name joined to them is where _Resolver and discover put
    a file in it that is not a symlink."""
    if not directory:
        return None
    real = os.path.realpath(directory)
    prefix = real if real[-1] == "/" else real + "/"
    return (prefix, prefix[cut:]) if prefix.startswith(inside) else None


def _megatron_pair(path: Path, where: str) -> tuple[Path, Path]:
    # The prefix may itself contain dots (`wiki.en_text_document`): strip only the extension.
    ext = path.suffix if path.suffix.lower() in (".bin", ".idx") else ""
    prefix = path.name[: len(path.name) - len(ext)]
    bin_path, idx_path = path.with_name(prefix + ".bin"), path.with_name(prefix + ".idx")
    for needed in (bin_path, idx_path):
        if not needed.is_file():
            raise SourceDataError(
                f"{where}{needed}: missing (a Megatron dataset needs both .bin and .idx)"
            )
    return bin_path, idx_path


def discover(spec: SourceSpec, root: Path, exclude: Iterable[Path] = ()) -> list[DataFile]:
    """Resolve the source's patterns under `root` into DataFiles, sorted and de-duplicated;
    nothing under `exclude` (this run's index output) or any other mds index is a source."""
    where = f"source '{spec.name}': "
    root = root.resolve()
    skip = _Excluded(root, exclude)
    resolve = _Resolver()
    inside = os.path.join(str(root), "")  # the root with one trailing separator
    cut = len(inside)
    found: dict[str, DataFile] = {}
    seen: dict[str, tuple[int, int, bool]] = {}
    # A glob's regular files that are not symlinks, in a directory inside the root, are
    # placed by their directory (resolved once) and names; their format by their extension
    # (the name from its first dot, named once). Anything else takes `other` below.
    places: dict[str, tuple[str, str] | None] = {}
    formats: dict[str, str | None] = {}
    local = DataFile.local

    def other(match: Path | str, known: tuple[int, int, bool] | None) -> None:
        text = os.fspath(match)  # a Path's string is made anew each time it is asked
        fmt = spec.format or detect_format(text.rpartition(os.sep)[2])
        if fmt is None:
            raise ConfigError(
                f"{where}cannot tell the format of {match} from its name; set `format`"
            )
        companion = None
        if fmt == "megatron":
            match, companion = _megatron_pair(Path(match), where)
            text, known = os.fspath(match), None
        resolved = resolve(text, None if known is None else known[2])
        if not resolved.startswith(inside):
            raise ConfigError(
                f"{where}{match} is outside the data root {root}; set [index] `root`"
            )
        rel = resolved[cut:] if os.sep == "/" else resolved[cut:].replace(os.sep, "/")
        found[resolved] = local(  # its Path made only if it is read
            resolved,
            rel,
            fmt,
            companion.resolve() if companion else None,
            None if known is None else known[:2],
        )

    for pattern in spec.paths:
        matches = _expand(pattern, root, where, skip, seen)
        if not matches:
            raise ConfigError(f"{where}`path` {pattern!r} matches no files under {root}")
        for match in matches:
            if match.__class__ is not _Group:
                other(match, seen.get(os.fspath(match)))
                continue
            directory = match.parent  # type: ignore[union-attr]
            place = places.get(directory, ())
            if place == ():
                place = places[directory] = _place(directory, inside, cut)
            for name, size, mtime in match.files:  # type: ignore[union-attr]
                fmt = spec.format
                if not fmt:
                    ext = name[name.find(".") :] if "." in name else ""
                    fmt = formats.get(ext, "")
                    if fmt == "":
                        fmt = formats[ext] = detect_format(ext) if ext else None
                if place is None or fmt is None or fmt == "megatron":
                    other(cat(directory, name), (size, mtime, False))
                    continue
                text = place[0] + name
                found[text] = local(text, place[1] + name, fmt, None, (size, mtime))
    return one_format(found.values(), where, "files")


def one_format(found: Iterable[DataFile], where: str, what: str) -> list[DataFile]:
    """A source's files in path order; a source reads one format, so several are refused."""
    files = sorted(found, key=attrgetter("rel"))
    formats = sorted({f.format for f in files})
    if len(formats) > 1:
        raise ConfigError(
            f"{where}{what} of several formats ({', '.join(formats)}); split them into sources "
            "or narrow `path`"
        )
    return files
