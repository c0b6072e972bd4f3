"""Turn a source's `path` patterns into the sorted list of data files it covers.

A pattern is a file, a glob (`**` allowed), a directory (every data file under it), a
Hugging Face `save_to_disk` directory, or a Megatron prefix (`name` for `name.bin`/`name.idx`).
"""

from __future__ import annotations

import glob
import json
from dataclasses import dataclass
from pathlib import Path

from mds.executor.errors import ConfigError, SourceDataError
from mds.planner.config import SourceSpec

__all__ = ["DataFile", "detect_format", "discover"]

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
)


@dataclass(frozen=True)
class DataFile:
    """One data file of a source; for Megatron `path` is the .bin and `companion` the .idx."""

    path: Path
    rel: str
    format: str
    companion: Path | None = None


def detect_format(path: Path) -> str | None:
    name = path.name.lower()
    for ext, fmt in _EXTENSIONS:
        if name.endswith(ext):
            return fmt
    return None


def _hf_files(directory: Path) -> list[Path]:
    state = directory / "state.json"
    try:
        files = json.loads(state.read_text(encoding="utf-8"))["_data_files"]
        return [directory / entry["filename"] for entry in files]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SourceDataError(f"{state}: not a readable save_to_disk state file ({exc})") from None


def _expand_dir(directory: Path) -> list[Path]:
    if (directory / "state.json").is_file():
        return _hf_files(directory)
    return [
        p
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.name.startswith(".") and detect_format(p) is not None
    ]


def _expand(pattern: str, root: Path) -> list[Path]:
    full = Path(pattern) if Path(pattern).is_absolute() else root / pattern
    if glob.has_magic(pattern):
        matches = [Path(m) for m in sorted(glob.glob(str(full), recursive=True))]
    elif full.exists():
        matches = [full]
    else:
        # A Megatron prefix: `name` for `name.idx` + `name.bin` (either half names the pair,
        # so a missing half is reported as such rather than as "matches no files").
        halves = [full.with_name(full.name + ext) for ext in (".idx", ".bin")]
        matches = [h for h in halves if h.is_file()][:1]
    out: list[Path] = []
    for match in matches:
        out.extend(_expand_dir(match) if match.is_dir() else [match])
    return out


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


def discover(spec: SourceSpec, root: Path) -> list[DataFile]:
    """Resolve the source's patterns under `root` into DataFiles, sorted and de-duplicated."""
    where = f"source '{spec.name}': "
    root = root.resolve()
    found: dict[Path, DataFile] = {}
    for pattern in spec.paths:
        matches = _expand(pattern, root)
        if not matches:
            raise ConfigError(f"{where}`path` {pattern!r} matches no files under {root}")
        for match in matches:
            fmt = spec.format or detect_format(match)
            if fmt is None:
                raise ConfigError(
                    f"{where}cannot tell the format of {match} from its name; set `format`"
                )
            companion = None
            if fmt == "megatron":
                match, companion = _megatron_pair(match, where)
            resolved = match.resolve()
            try:
                rel = resolved.relative_to(root).as_posix()
            except ValueError:
                raise ConfigError(
                    f"{where}{match} is outside the data root {root}; set [index] `root`"
                ) from None
            found[resolved] = DataFile(
                resolved, rel, fmt, companion.resolve() if companion else None
            )
    files = sorted(found.values(), key=lambda f: f.rel)
    formats = sorted({f.format for f in files})
    if len(formats) > 1:
        raise ConfigError(
            f"{where}files of several formats ({', '.join(formats)}); split them into sources "
            "or narrow `path`"
        )
    return files
