"""Load and validate the TOML config: the `[index]` table and the `[[source]]` list.

Every error names the file and the key. Keys used by later stages (`[train]`, `[cost]`,
per-source weights) are accepted here and validated by the stage that owns them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mds.core.index_manifest import IMAGE_LAYOUTS  # image-text formats -> payload layout
from mds.core.storage import is_url
from mds.errors import ConfigError
from mds.planner.index.config_file import check_keys, load_toml, place
from mds.planner.runtime.engine import check_address, check_engine

__all__ = [
    "BAD_IMAGE_RULES",
    "FORMATS",
    "IMAGE_LAYOUTS",
    "Estimate",
    "ImageSpec",
    "IndexConfig",
    "LengthSpec",
    "SourceSpec",
    "load_config",
    "parse_config",
    "parse_source",
    "resolve_format",
]

FORMATS = ("parquet", "jsonl", "jsonl.zst", "arrow", "megatron", "webdataset")
BAD_IMAGE_RULES = ("error", "drop")
DEFAULT_MARKER = "<image>"
FINGERPRINT_MODES = ("sampled", "full")
LENGTH_KEYS = ("tokens", "count", "tokenizer", "estimate")
INDEX_SOURCE_KEYS = (
    "name", "path", "format", "text", "keep", *LENGTH_KEYS, "images", "on_bad_image",
)  # fmt: skip
# Per-source keys owned by the planner; accepted here so one file configures every stage.
PLAN_SOURCE_KEYS = ("weight", "weight_by", "filter", "max_epochs", "warn_epochs", "on_exhausted")
# `[vision]` (the model's image geometry) is parsed by the planner; the index reads `marker`.
TOP_LEVEL_KEYS = ("index", "source", "train", "cost", "plan", "vision", "mixing")
INDEX_KEYS = ("root", "output", "workers", "fingerprint", "engine", "address")
# Index columns, plus the columns `mds export` adds beside kept metadata.
RESERVED_COLUMNS = (
    "file_id",
    "file_row",
    "offset",
    "length",
    "n_tokens",
    "row",
    "file",
    "source",
    "step",
    "rank",
    "micro_batch",
    "sample_id",
    "epoch",
    "byte_offset",
    "byte_length",
    "planned_tokens",
    "cost",
    "cost_units",
    "gid",
    "order",
    "source_id",
    "n_images",
    "image_width",
    "image_height",
)
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_ESTIMATE_RE = re.compile(r"^\s*(bytes|chars)\s*/\s*([0-9]+(?:\.[0-9]+)?)\s*$")


@dataclass(frozen=True)
class Estimate:
    """A labelled token-count estimate: ceil(len(text in `unit`) / `divisor`)."""

    unit: str
    divisor: float

    @property
    def rule(self) -> str:
        return f"{self.unit}/{self.divisor:g}"


@dataclass(frozen=True)
class LengthSpec:
    """How a source's `n_tokens` is obtained, in the priority the docs give."""

    kind: str  # "tokens" | "count" | "tokenizer" | "estimate" | "megatron" | "auto" (until found)
    column: str | None = None
    tokenizer: str | None = None
    estimate: Estimate | None = None

    @property
    def exact(self) -> bool:
        return self.kind != "estimate"

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "exact": self.exact}
        if self.column is not None:
            out["column"] = self.column
        if self.tokenizer is not None:
            out["tokenizer"] = self.tokenizer
        if self.estimate is not None:
            out["rule"] = self.estimate.rule
        return out


@dataclass(frozen=True)
class ImageSpec:
    """The images of an image-text source (docs/vision.md): `field` as configured (a
    WebDataset's image extensions, `;`-separated, or the Parquet column / JSONL key), what
    a bad image does, and the marker that places images in the text."""

    field: str
    on_bad: str = "error"
    marker: str = DEFAULT_MARKER

    @property
    def extensions(self) -> tuple[str, ...]:
        """A WebDataset's image extensions, in the configured order (lower case)."""
        return tuple(e.strip().lower() for e in self.field.split(";") if e.strip())

    def describe(self) -> dict[str, str]:
        return {"images": self.field, "on_bad_image": self.on_bad, "marker": self.marker}


@dataclass(frozen=True)
class SourceSpec:
    """One `[[source]]` entry: where its files are and how to read lengths and metadata."""

    name: str
    paths: tuple[str, ...]
    format: str | None
    length: LengthSpec
    text: str | None = None
    keep: tuple[str, ...] = ()
    plan: dict[str, Any] = field(default_factory=dict, compare=False)
    images: ImageSpec | None = None

    @property
    def payload(self) -> dict[str, str] | None:
        """Where the executor finds the sample's content."""
        if self.images is not None:
            assert self.text is not None and self.format is not None
            return {
                "kind": "image_text",
                "layout": IMAGE_LAYOUTS[self.format],
                "text": self.text,
                "images": self.images.field,
            }
        if self.length.kind in ("tokens", "megatron"):
            return {"kind": "token_ids", "column": self.length.column or ""}
        if self.text is not None:
            return {"kind": "text", "column": self.text}
        return None

    def columns(self) -> tuple[str, ...]:
        """Source columns the index reads (length inputs, payload and kept metadata)."""
        cols = [c for c in (self.length.column, self.text) if c]
        cols += [c for c in self.keep if c not in cols]
        return tuple(dict.fromkeys(cols))


@dataclass(frozen=True)
class IndexConfig:
    """Everything `mds index` needs: the data root, output dir and the sources."""

    root: Path
    sources: tuple[SourceSpec, ...]
    output: Path | str | None = None  # a directory, or an s3:// / gs:// prefix
    workers: int | None = None
    fingerprint: str = "sampled"
    path: Path | None = None
    engine: str = "local"  # where the scans run: local or ray (src/mds/planner/runtime/engine.py)
    address: str | None = None  # the Ray cluster's address
    raw: dict[str, Any] = field(default_factory=dict, compare=False)


def _where(path: Path | None) -> str:
    return f"{path}: " if path else ""


def _string(table: dict[str, Any], key: str, where: str) -> str | None:
    value = table.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{where}`{key}` must be a non-empty string, got {value!r}")
    return value


def _strings(table: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}`{key}` must be a string or a list of strings, got {value!r}")
    return tuple(value)


def parse_estimate(value: str, where: str) -> Estimate:
    match = _ESTIMATE_RE.match(value)
    if not match or float(match.group(2)) <= 0:
        raise ConfigError(
            f'{where}`estimate` must look like "bytes/4" or "chars/3.5", got {value!r}'
        )
    return Estimate(match.group(1), float(match.group(2)))


_HOW_TO_MEASURE = (
    "say how to measure length: set `tokens` (a token-id list column), `count` "
    "(an integer column), `tokenizer` (a tokenizer.json, with `text`) or `estimate` "
    '(e.g. "bytes/4", with `text`)'
)


def _length_spec(
    table: dict[str, Any], fmt: str | None, text: str | None, where: str
) -> LengthSpec:
    given = [k for k in LENGTH_KEYS if k in table]
    if fmt == "megatron":
        if given:
            raise ConfigError(
                f'{where}`{given[0]}` does not apply to format "megatron": lengths come from the .idx'
            )
        return LengthSpec("megatron")
    if len(given) > 1:
        raise ConfigError(
            f"{where}set only one of `tokens`, `count`, `tokenizer`, `estimate`; got {', '.join(given)}"
        )
    if not given:
        # Only a Megatron dataset knows its lengths; that is settled once the files are found.
        return LengthSpec("auto")
    kind = given[0]
    if kind in ("tokens", "count"):
        return LengthSpec(kind, column=_string(table, kind, where))
    if text is None:
        raise ConfigError(f"{where}`{kind}` needs `text`: the column holding the text to measure")
    if kind == "tokenizer":
        return LengthSpec(kind, column=text, tokenizer=_string(table, "tokenizer", where))
    estimate = _string(table, "estimate", where)
    assert estimate is not None
    return LengthSpec(kind, column=text, estimate=parse_estimate(estimate, where))


def resolve_format(spec: SourceSpec, fmt: str) -> SourceSpec:
    """Settle the length spec once the files' format is known (auto-detected formats)."""
    where = f"source '{spec.name}': "
    if spec.images is not None and fmt not in IMAGE_LAYOUTS:
        raise ConfigError(
            f"{where}`images` does not apply to format {fmt!r}; image-text sources are "
            f"{', '.join(IMAGE_LAYOUTS)}"
        )
    if fmt == "megatron":
        if spec.length.kind not in ("auto", "megatron"):
            raise ConfigError(
                f'{where}`{spec.length.kind}` does not apply to format "megatron": lengths come from the .idx'
            )
        if spec.keep or spec.text:
            key = "keep" if spec.keep else "text"
            raise ConfigError(
                f'{where}`{key}` does not apply to format "megatron": it has no columns'
            )
        return replace(spec, format=fmt, length=LengthSpec("megatron"))
    if spec.images is None and fmt == "webdataset":
        raise ConfigError(
            f'{where}format "webdataset" needs `images`: the member extensions that are images '
            '(e.g. "jpg;png")'
        )
    if spec.images is not None and fmt == "webdataset" and spec.keep:
        raise ConfigError(f'{where}`keep` does not apply to format "webdataset": it has no columns')
    if spec.images is not None and fmt == "webdataset" and spec.length.kind == "count":
        raise ConfigError(
            f'{where}`count` does not apply to format "webdataset": it has no columns; use '
            "`tokenizer` or `estimate`"
        )
    if spec.length.kind == "auto":
        raise ConfigError(f"{where}{_HOW_TO_MEASURE}")
    return replace(spec, format=fmt)


def _image_spec(
    table: dict[str, Any], fmt: str | None, text: str | None, marker: str, where: str
) -> ImageSpec | None:
    """The `images` and `on_bad_image` keys of a source (docs/vision.md)."""
    images = _string(table, "images", where)
    on_bad = _string(table, "on_bad_image", where)
    if images is None:
        if on_bad is not None:
            raise ConfigError(
                f"{where}`on_bad_image` applies to image-text sources (with `images`)"
            )
        return None
    if fmt is not None and fmt not in IMAGE_LAYOUTS:
        raise ConfigError(
            f"{where}`images` does not apply to format {fmt!r}; image-text sources are "
            f"{', '.join(IMAGE_LAYOUTS)}"
        )
    if on_bad is not None and on_bad not in BAD_IMAGE_RULES:
        raise ConfigError(
            f"{where}`on_bad_image` must be one of {', '.join(BAD_IMAGE_RULES)}, got {on_bad!r}"
        )
    if text is None:
        raise ConfigError(
            f"{where}`images` needs `text`: the column, key or member extension of the text"
        )
    if "tokens" in table:
        raise ConfigError(
            f"{where}`tokens` does not apply to an image-text source: its text is counted "
            "with `tokenizer`, `estimate` or `count`"
        )
    spec = ImageSpec(images, on_bad or "error", marker)
    if fmt == "webdataset":
        parts = images.split(";")
        if not all(p.strip() for p in parts):
            raise ConfigError(
                f'{where}`images` must be member extensions separated by ";" (e.g. "jpg;png"), '
                f"got {images!r}"
            )
        if text.startswith("json:") and not text[5:]:
            raise ConfigError(
                f'{where}`text` "json:" needs the key of the .json member: "json:KEY"'
            )
        if text.lower() in spec.extensions:
            raise ConfigError(f"{where}`text` {text!r} is also one of the image extensions")
        if "keep" in table:
            raise ConfigError(
                f'{where}`keep` does not apply to format "webdataset": it has no columns'
            )
    return spec


def parse_source(table: dict[str, Any], where: str, marker: str = DEFAULT_MARKER) -> SourceSpec:
    """Validate one `[[source]]` table; `where` prefixes every error message; `marker`: the
    `[vision]` image marker (image-text sources count the text between markers)."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}must be a table")
    check_keys(table, INDEX_SOURCE_KEYS + PLAN_SOURCE_KEYS, where)
    name = _string(table, "name", where)
    if name is None:
        raise ConfigError(f"{where}`name` is required")
    if not _NAME_RE.match(name):
        raise ConfigError(
            f"{where}`name` must be 1-64 letters, digits, '_', '.' or '-' (starting with a "
            f"letter or digit), got {name!r}"
        )
    where = f"{where[:-2]} ('{name}'): " if where.endswith(": ") else where
    paths = _strings(table, "path", where)
    if not paths:
        raise ConfigError(
            f"{where}`path` is required: a file, directory or glob, or a list of them"
        )
    fmt = _string(table, "format", where)
    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(f"{where}`format` must be one of {', '.join(FORMATS)}, got {fmt!r}")
    text = _string(table, "text", where)
    images = _image_spec(table, fmt, text, marker, where)
    length = _length_spec(table, fmt, text, where)
    keep = _strings(table, "keep", where)
    if fmt == "megatron" and (keep or text):
        raise ConfigError(
            f'{where}`{"keep" if keep else "text"}` does not apply to format "megatron": it has no columns'
        )
    for col in keep:
        if col in RESERVED_COLUMNS:
            raise ConfigError(f"{where}`keep` cannot include {col!r}: the index uses that name")
    plan = {k: table[k] for k in PLAN_SOURCE_KEYS if k in table}
    return SourceSpec(name, paths, fmt, length, text, keep, plan, images)


def parse_config(
    data: dict[str, Any], *, path: Path | None = None, base: Path | None = None
) -> IndexConfig:
    """Build an IndexConfig from parsed TOML; relative paths resolve against `base`."""
    where = _where(path)
    check_keys(data, TOP_LEVEL_KEYS, where)
    base = base or (path.parent if path else Path.cwd())
    index = data.get("index", {})
    if not isinstance(index, dict):
        raise ConfigError(f"{where}`index` must be a table")
    check_keys(index, INDEX_KEYS, f"{where}[index]: ")
    root_text = _string(index, "root", f"{where}[index]: ") or "."
    # An s3:// root stays a URL (its objects are listed and read with range requests).
    root = root_text.rstrip("/") if is_url(root_text) else (base / root_text).resolve()
    output = _string(index, "output", f"{where}[index]: ")  # a directory or an s3:// prefix
    workers = index.get("workers")
    if workers is not None and (
        not isinstance(workers, int) or isinstance(workers, bool) or workers < 1
    ):
        raise ConfigError(f"{where}[index]: `workers` must be a positive integer, got {workers!r}")
    fingerprint = _string(index, "fingerprint", f"{where}[index]: ") or "sampled"
    if fingerprint not in FINGERPRINT_MODES:
        raise ConfigError(
            f"{where}[index]: `fingerprint` must be one of {', '.join(FINGERPRINT_MODES)}, got {fingerprint!r}"
        )
    engine, address = parse_engine(index, f"{where}[index]: ")
    marker = _marker(data.get("vision"), where)
    tables = data.get("source", [])
    if not isinstance(tables, list) or not tables:
        raise ConfigError(f"{where}no sources: add at least one [[source]] table")
    sources = [
        _tokenizer_from(parse_source(t, f"{where}[[source]] #{i + 1}: ", marker), base, root)
        for i, t in enumerate(tables)
    ]
    seen: set[str] = set()
    for i, spec in enumerate(sources):
        if spec.name in seen:
            raise ConfigError(f"{where}[[source]] #{i + 1}: duplicate source name {spec.name!r}")
        seen.add(spec.name)
    return IndexConfig(
        root=root,  # type: ignore[arg-type]
        sources=tuple(sources),
        output=place(base, output),
        workers=workers,
        fingerprint=fingerprint,
        path=path,
        engine=engine,
        address=address,
        raw=data,
    )


def _tokenizer_from(spec: SourceSpec, base: Path, root: Path | str) -> SourceSpec:
    """A relative `tokenizer` resolved against the config's directory (`base`), as every
    relative path of the config is, whatever the data root (a local tokenizer.json beside a
    config whose data is in object storage). It is recorded relative to a local data root
    that holds it (so it moves with the data), else as an absolute path."""
    given = spec.length.tokenizer
    if given is None or is_url(given):
        return spec
    joined = base / given
    path = joined.parent.resolve() / joined.name
    text = str(path)
    if not is_url(root):
        rel = os.path.relpath(path, Path(root))
        if rel != ".." and not rel.startswith(".." + os.sep):
            text = Path(rel).as_posix()
    return replace(spec, length=replace(spec.length, tokenizer=text))


def _marker(vision: Any, where: str) -> str:
    """The `[vision]` table's `marker` (the rest of the table is the planner's)."""
    if vision is None:
        return DEFAULT_MARKER
    if not isinstance(vision, dict):
        raise ConfigError(f"{where}`vision` must be a table")
    marker = vision.get("marker", DEFAULT_MARKER)
    if not isinstance(marker, str) or not marker:
        raise ConfigError(f"{where}[vision]: `marker` must be a non-empty string, got {marker!r}")
    return marker


def parse_engine(table: dict[str, Any], where: str) -> tuple[str, str | None]:
    """A table's `engine` and `address` keys (shared by [index] and [plan])."""
    engine = check_engine(table.get("engine", "local"), f"{where}`engine`")
    address = table.get("address")
    if address is not None:
        check_address(address, f"{where}`address`")
        if engine != "ray":
            raise ConfigError(f'{where}`address` applies to engine = "ray" only')
    return engine, address


def load_config(path: str | Path) -> IndexConfig:
    """Read and validate a TOML config file."""
    return parse_config(load_toml(path), path=Path(path))
