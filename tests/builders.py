"""Small builders of real data files for the tests: each writes one tiny file into a directory.

A plain module (tests/conftest.py puts tests/ on sys.path): `from builders import ...`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from mds.planner.index.config import SourceSpec, parse_source, resolve_format
from mds.planner.index.discover import DataFile, detect_format
from mds.planner.index.scan import ScanContext


def _mkparent(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _table(data: pa.Table | dict[str, Any], schema: pa.Schema | None = None) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    return pa.table(data, schema=schema)


def write_parquet(
    path: Path,
    data: pa.Table | dict[str, Any],
    schema: pa.Schema | None = None,
    **kwargs: Any,
) -> Path:
    """Write `data` (a dict of columns or a pyarrow Table) as one Parquet file."""
    pq.write_table(_table(data, schema), _mkparent(path), **kwargs)
    return path


def write_arrow(
    path: Path,
    data: pa.Table | dict[str, Any],
    schema: pa.Schema | None = None,
    *,
    stream: bool = False,
) -> Path:
    """Write an Arrow IPC file (or, with `stream`, an IPC stream as `save_to_disk` does)."""
    table = _table(data, schema)
    with pa.OSFile(str(_mkparent(path)), "wb") as sink:
        opener = pa.ipc.new_stream if stream else pa.ipc.new_file
        with opener(sink, table.schema) as writer:
            writer.write_table(table)
    return path


def write_save_to_disk(directory: Path, shards: Sequence[pa.Table | dict[str, Any]]) -> Path:
    """A Hugging Face `save_to_disk` directory: IPC-stream shards listed by state.json."""
    directory.mkdir(parents=True, exist_ok=True)
    names = [f"data-{i:05d}-of-{len(shards):05d}.arrow" for i in range(len(shards))]
    for name, shard in zip(names, shards, strict=True):
        write_arrow(directory / name, shard, stream=True)
    state = {
        "_data_files": [{"filename": name} for name in names],
        "_fingerprint": "0123456789abcdef",
        "_format_type": None,
        "_split": None,
    }
    (directory / "state.json").write_text(json.dumps(state), encoding="utf-8")
    (directory / "dataset_info.json").write_text("{}", encoding="utf-8")
    return directory


# Records of every kind a JSONL scan meets: a missing field, a null, unicode, a nested value.
JSONL_RECORDS = [
    {"n": 3, "lang": "en", "text": "hello world"},
    {"n": 0, "lang": "fr", "text": ""},
    {"n": 12, "lang": None, "text": "ünïcödé ✓"},
    {"n": 7, "text": "no lang here", "extra": {"nested": [1, 2]}},
    {"n": 1, "lang": "de", "text": "x" * 200},
]


def jsonl_bytes(records: Iterable[Any], *, trailing_newline: bool = True) -> bytes:
    """Records (dicts, or raw str/bytes lines written as they are) joined by newlines."""
    lines = []
    for rec in records:
        if isinstance(rec, bytes):
            lines.append(rec)
        elif isinstance(rec, str):
            lines.append(rec.encode("utf-8"))
        else:
            lines.append(json.dumps(rec, ensure_ascii=False).encode("utf-8"))
    data = b"\n".join(lines)
    return data + b"\n" if trailing_newline and lines else data


def write_jsonl(path: Path, records: Iterable[Any], *, trailing_newline: bool = True) -> bytes:
    """Write a JSONL file (see `jsonl_bytes`); return the bytes written."""
    data = jsonl_bytes(records, trailing_newline=trailing_newline)
    _mkparent(path).write_bytes(data)
    return data


def write_zst(path: Path, data: bytes, *, frames: int = 1) -> Path:
    """Compress `data` as `frames` concatenated zstd frames (split on line boundaries)."""
    cctx = zstandard.ZstdCompressor(level=3)
    if frames <= 1:
        out = cctx.compress(data)
    else:
        lines = data.splitlines(keepends=True)
        step = max(1, -(-len(lines) // frames))
        pieces = [b"".join(lines[i : i + step]) for i in range(0, len(lines), step)]
        out = b"".join(cctx.compress(p) for p in pieces)
    _mkparent(path).write_bytes(out)
    return path


def write_megatron(prefix: Path, sequences: Sequence[Sequence[int]], dtype: Any = "uint16"):
    """A Megatron `prefix.bin` + `prefix.idx` written by the executor's writer."""
    from mds.formats.megatron import write_dataset

    _mkparent(prefix)
    return write_dataset(prefix, [list(s) for s in sequences], dtype)


def write_tokenizer(path: Path, words: Sequence[str] = ()) -> Path:
    """A tiny WordLevel tokenizer.json (whitespace pre-tokenizer, `[UNK]` for the rest)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0}
    for word in words:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(_mkparent(path)))
    return path


def source(**table: Any) -> SourceSpec:
    """A validated SourceSpec from `[[source]]` keys (name and path default; None drops a key)."""
    table = {k: v for k, v in table.items() if v is not None}
    table.setdefault("name", "src")
    table.setdefault("path", "*")
    return parse_source(table, "test: ")


def data_file(path: Path, root: Path | None = None, fmt: str | None = None) -> DataFile:
    """A DataFile for `path` as discovery would make it (Megatron: the .bin plus its .idx)."""
    path = Path(path).resolve()
    root = (root or path.parent).resolve()
    fmt = fmt or detect_format(path)
    assert fmt is not None, path
    companion = None
    if fmt == "megatron":
        base = path.name.rsplit(".", 1)[0] if path.suffix in (".bin", ".idx") else path.name
        path, companion = path.with_name(base + ".bin"), path.with_name(base + ".idx")
    return DataFile(path, path.relative_to(root).as_posix(), fmt, companion)


def ctx(spec: SourceSpec, fmt: str, tokenizer: Path | None = None, **kwargs: Any) -> ScanContext:
    """A ScanContext with the spec's format settled, as the build does."""
    return ScanContext(resolve_format(spec, fmt), tokenizer, **kwargs)


def config_file(directory: Path, text: str, name: str = "mds.toml") -> Path:
    path = _mkparent(directory / name)
    path.write_text(text, encoding="utf-8")
    return path


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` (relative path -> bytes), to compare before and after."""
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


# --- a small multi-source data root ------------------------------------------------------------

MULTI_TOML = """
[index]
output = "index"

[[source]]
name = "web"
path = "web/*.parquet"
tokens = "tokens"
keep = ["lang", "quality"]

[[source]]
name = "forum"
path = "forum/forum.jsonl"
count = "n"
text = "text"
keep = ["lang"]

[[source]]
name = "code"
path = "code/*.jsonl.zst"
text = "content"
estimate = "bytes/4"

[[source]]
name = "wiki"
path = "wiki"
tokens = "input_ids"
text = "text"
keep = ["lang"]

[[source]]
name = "math"
path = "math/math_text_document"
"""


def web_part(i: int, rows: int = 4, offset: int = 0) -> dict[str, Any]:
    """Columns of web/part-<i>.parquet: token lists of varying length plus metadata."""
    return {
        "tokens": pa.array(
            [list(range((i * 7 + r * 3 + offset) % 11 + 1)) for r in range(rows)],
            pa.list_(pa.int32()),
        ),
        "lang": [("en", "fr", "de")[(i + r) % 3] for r in range(rows)],
        "quality": [round(0.1 * (r + 1) + i, 3) for r in range(rows)],
    }


FORUM = [
    {"n": 5, "text": "first post", "lang": "en"},
    {"n": 0, "text": "", "lang": "en"},
    {"n": 12, "text": "réponse en français", "lang": "fr"},
]
CODE = [
    [{"content": "def f():\n    return 1\n"}, {"content": "x = 1"}],
    [{"content": "print('héllo')"}, {"content": ""}, {"content": "a" * 33}],
]
WIKI = [
    {"input_ids": [1, 2, 3, 4], "text": "one", "lang": "en"},
    {"input_ids": [5], "text": "two", "lang": "sv"},
]
MATH = [[1, 2, 3], [4, 5], [6] * 9]


def multi_source(root: Path) -> Path:
    """Write five sources in five formats under `root` and its mds.toml; return the config path.

    web: Parquet split over 3 files; forum: JSONL; code: two .jsonl.zst files (estimate);
    wiki: a save_to_disk directory; math: a Megatron dataset.
    """
    for i in range(3):
        write_parquet(root / f"web/part-{i:05d}.parquet", web_part(i))
    write_jsonl(root / "forum/forum.jsonl", FORUM)
    for i, records in enumerate(CODE):
        write_zst(root / f"code/code-{i:05d}.jsonl.zst", jsonl_bytes(records), frames=i + 1)
    wiki = {key: [rec[key] for rec in WIKI] for key in WIKI[0]}
    wiki["input_ids"] = pa.array(wiki["input_ids"], pa.list_(pa.int32()))
    write_save_to_disk(root / "wiki", [wiki])
    write_megatron(root / "math/math_text_document", MATH)
    return config_file(root, MULTI_TOML)


def uleb(n: int) -> bytes:
    """`n` as a ULEB128 varint (Thrift's and Parquet's), for hand-built test bytes."""
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)
