"""What a directory or a name covers, decided once for every backend.

Local discovery (index/discover.py) and object-store discovery (index/objects.py) find
their candidates differently (a walk of a directory, one listing of a prefix), then hand
them here as a `Listing` of (relative key, size), so the same tree gives the same sources
on a file system, on S3 and on GCS:

- `directory_files`: the data files of a directory: a Hugging Face `save_to_disk`
  directory's (the files its state.json names), else every data file by its name, hidden
  names (any part starting with ".") left out;
- `megatron_half`: the half of a Megatron pair (`name.idx` or `name.bin`) that a prefix
  `name` names;
- `detect_format`: a file's format from its name.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable, Iterable, Iterator
from pathlib import PurePath, PurePosixPath

from mds.errors import ConfigError, SourceDataError

__all__ = [
    "HF_INFO",
    "HF_STATE",
    "Listing",
    "detect_format",
    "directory_files",
    "hidden",
    "inside_index",
    "megatron_half",
]

HF_STATE = "state.json"  # what save_to_disk writes beside its data-*.arrow files
HF_INFO = "dataset_info.json"
_STATE_MAX = 16 << 20  # bytes: a state.json lists file names, never data

_EXTENSIONS = (
    (".jsonl.zst", "jsonl.zst"),
    (".json.zst", "jsonl.zst"),
    (".ndjson.zst", "jsonl.zst"),
    (".parquet", "parquet"),
    (".pq", "parquet"),
    (".jsonl", "jsonl"),
    (".ndjson", "jsonl"),
    (".json", "jsonl"),
    (".arrow", "arrow"),
    (".feather", "arrow"),
    (".ipc", "arrow"),
    (".idx", "megatron"),
    (".bin", "megatron"),
    (".tar", "webdataset"),
)


# _EXTENSIONS by their last suffix, in their order: a name is tested against these only.
_BY_SUFFIX: dict[str, list[tuple[str, str]]] = {}
for _ext, _fmt in _EXTENSIONS:
    _BY_SUFFIX.setdefault(_ext[_ext.rindex(".") :], []).append((_ext, _fmt))


def detect_format(path: PurePath | str) -> str | None:
    """A data file's format from its name, or None when the name says nothing."""
    # a key or a name: its last part (a Path per call would cost more than the test)
    name = path.rsplit("/", 1)[-1].lower() if isinstance(path, str) else path.name.lower()
    dot = name.rfind(".")
    if dot < 0:
        return None
    for ext, fmt in _BY_SUFFIX.get(name[dot:], ()):
        if name.endswith(ext):
            return fmt
    return None


def hidden(key: str) -> bool:
    """Whether a relative key has a hidden part (temporaries, lock files, .cache/)."""
    return any(part.startswith(".") for part in key.split("/"))


class Listing:
    """The files under one place: relative POSIX keys (sorted) and their sizes."""

    def __init__(self, entries: Iterable[tuple[str, int]] = (), indexes: Iterable[str] = ()):
        self._sizes = dict(sorted(entries))
        self.indexes = frozenset(indexes)  # mds index directories left out of the listing

    def index_of(self, key: str) -> str | None:
        """The left-out mds index directory `key` is (or is inside), else None."""
        for directory in (key, *(str(p) for p in PurePosixPath(key).parents)):
            if directory in self.indexes:
                return directory
        return None

    @classmethod
    def of(cls, keys: Listing | Iterable[str]) -> Listing:
        """A Listing as it is, or one of bare keys (sizes unknown: 0)."""
        return keys if isinstance(keys, Listing) else cls((k, 0) for k in keys)

    def __contains__(self, key: object) -> bool:
        return key in self._sizes

    def __iter__(self) -> Iterator[str]:
        return iter(self._sizes)

    def __len__(self) -> int:
        return len(self._sizes)

    def size(self, key: str) -> int:
        return self._sizes[key]

    def under(self, prefix: str) -> Listing:
        """The files under the directory `prefix`, keyed relative to it."""
        start = prefix.rstrip("/") + "/"
        return Listing((k[len(start) :], s) for k, s in self._sizes.items() if k.startswith(start))


def inside_index(where: str, pattern: str, index: str) -> ConfigError:
    """The error for a `path` that names an mds index or a file inside one."""
    return ConfigError(
        f"{where}`path` {pattern!r} is inside the mds index {index}; an index (and a "
        "plan or export output) is never a source: point `path` at the data files"
    )


def directory_files(shown: str, files: Listing, read: Callable[[str], bytes]) -> list[str]:
    """The data files (keys relative to the directory) of the directory `shown` (its path
    or URL, for messages), given its `files` and a `read` of one of them.

    A directory with a state.json is a `save_to_disk` directory: its data are the files
    state.json names (each must be there). Otherwise every file whose name tells its format,
    except hidden ones; a save_to_disk directory that lost its state.json is refused rather
    than read as JSON files."""
    if HF_STATE in files:
        size = files.size(HF_STATE)
        if size > _STATE_MAX:
            raise SourceDataError(
                f"{shown}/{HF_STATE}: {size:,} bytes, too large for a save_to_disk state file"
            )
        return _state_files(shown, read(HF_STATE), files)
    if HF_INFO in files and any(
        "/" not in k and k.startswith("data-") and k.endswith(".arrow") for k in files
    ):
        raise SourceDataError(
            f"{shown}: a save_to_disk directory without {HF_STATE}; restore {HF_STATE} "
            "(save_to_disk writes it), or set `path` to its data-*.arrow files"
        )
    return [k for k in files if not hidden(k) and detect_format(k) is not None]


def _state_files(shown: str, state: bytes, files: Listing) -> list[str]:
    where = f"{shown}/{HF_STATE}"
    try:
        names = [entry["filename"] for entry in json.loads(state)["_data_files"]]
        if not all(isinstance(n, str) and n for n in names):
            raise TypeError("a filename is not a non-empty string")
    except (ValueError, KeyError, TypeError) as exc:
        raise SourceDataError(f"{where}: not a readable save_to_disk state file ({exc})") from None
    out = []
    for name in names:
        key = posixpath.normpath(name)
        if key.startswith(("/", "../")) or key in ("..", "."):
            raise SourceDataError(f"{where}: data file {name!r} is outside its directory")
        if key not in files:
            raise SourceDataError(
                f"{where}: names {name!r}, which is missing; restore it or save the dataset again"
            )
        out.append(key)
    return out


def megatron_half(name: str, exists: Callable[[str], bool]) -> str | None:
    """`name.idx` (else `name.bin`) when `name` is a Megatron prefix whose half exists (a
    missing other half is then reported as such), else None."""
    if not name or name.endswith("/"):
        return None
    for ext in (".idx", ".bin"):
        if exists(name + ext):
            return name + ext
    return None
