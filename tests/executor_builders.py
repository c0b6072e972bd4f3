"""Builders for the executor tests: the sample plan, a tiny three-format world for the fuzz
tests, a plan rewriter that forges blocks and footers with valid checksums, and an oracle that
reads every planned sample's tokens with plain whole-file reads (no executor code), to compare
batches against.

A plain module (tests/conftest.py puts tests/ on sys.path): `from executor_builders import ...`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from builders import write_jsonl, write_megatron, write_parquet
from index_files import manifest_with_files
from plan_builders import REPO, sample_index, sample_plan_config

from mds.core.planfile import RankChunk
from mds.core.planfile_reader import PlanReader
from mds.core.planfile_writer import PlanWriter
from mds.formats.megatron import open_bin, read_index

TOKENIZER = REPO / "sample_data" / "tokenizer.json"
_PLANS: dict[str, tuple[Path, Path]] = {}


def sample_plan(
    tmp_path_factory, steps: int | None = None, dp_size: int | None = None
) -> tuple[Path, Path]:
    """(index, plan) of sample_data/mds.toml, planned once per session per override set."""
    from mds.planner.plan.build import build_plan, with_overrides

    key = json.dumps([steps, dp_size])
    if key not in _PLANS:
        index = sample_index(tmp_path_factory)
        out = tmp_path_factory.mktemp("executor-plan") / "plan.mds"
        config = with_overrides(sample_plan_config(index), steps=steps, dp_size=dp_size)
        build_plan(config, out)
        _PLANS[key] = (index, out)
    return _PLANS[key]


def tiny_data(root: Path) -> dict[str, Any]:
    """Three sources of token ids in three formats under `root` (Parquet in two files of
    several row groups, JSONL, Megatron), a symlink loop `loop` and a symlink `out.parquet`
    to root/../plan.mds (outside the root); returns the config (as a dict). A whole rank
    of its plan replays in milliseconds."""
    for part in range(2):
        tokens = [list(range(part * 50 + r, part * 50 + r + 1 + (r * 7) % 13)) for r in range(14)]
        write_parquet(root / f"web/part-{part}.parquet", {"tokens": tokens}, row_group_size=5)
    write_jsonl(
        root / "chat/chat.jsonl", [{"ids": list(range(1 + (r * 5) % 17))} for r in range(12)]
    )
    write_megatron(root / "math/doc", [[7] * (1 + (r * 3) % 11) for r in range(10)])
    (root / "loop").symlink_to("loop")  # a symlink loop, and a link out of the root
    (root / "out.parquet").symlink_to(root.parent / "plan.mds")
    return {
        "index": {"output": "index"},
        "source": [
            {"name": "web", "path": "web/*.parquet", "tokens": "tokens", "weight": 2},
            {"name": "chat", "path": "chat/chat.jsonl", "tokens": "ids", "weight": 1},
            {"name": "math", "path": "math/doc", "weight": 1},
        ],
        "train": {
            "steps": 8,
            "dp_size": 2,
            "micro_batches": 2,
            "samples_per_step": 8,
            "max_tokens_per_micro_batch": 64,
            "seed": 5,
        },
        "plan": {"chunk_steps": 3},
    }


BlockEdit = Callable[[int, int, RankChunk], RankChunk | None]


def rewrite_plan(
    src: Path,
    dst: Path,
    *,
    block: BlockEdit | None = None,
    footer: Callable[[dict[str, Any]], None] | None = None,
    version: int | None = None,
) -> Path:
    """A copy of plan `src` at `dst`, forged with valid checksums: every block read with
    PlanReader and written back with PlanWriter, `block(chunk, rank, rank_chunk)` returning a
    replacement (or None: unchanged), and `footer` editing the footer (without `layout`,
    which PlanWriter writes) in place. `version` 2 writes the previous format, whose blocks
    can hold fetch records that format 3 cannot express (a file index past the block's
    records, a record of a file no sample reads): what the executor must still refuse."""
    dst = Path(dst)
    with PlanReader(src) as reader:
        writer = PlanWriter(
            dst,
            dst.with_name(dst.name + ".tmp"),
            dp_size=reader.dp,
            micro_batches=reader.micro,
            id_width=reader.id_width,
            **({} if version is None else {"version": version}),
        )
        try:
            for c, (a, b, *_) in enumerate(reader.chunks):
                blocks = []
                for rank in range(reader.dp):
                    got = reader.rank_chunk(c, rank)
                    changed = block(c, rank, got) if block is not None else None
                    got = changed if changed is not None else got
                    blocks.append((got.counts, got.ids, got.fetch))
                writer.add_chunk(a, b, blocks)
            for name in sorted(reader.sections):
                writer.add_section(name, reader.section(name))
            data = json.loads(json.dumps(reader.footer))
            del data["layout"]
            if footer is not None:
                footer(data)
            writer.commit(data)
        except BaseException:
            writer.abort()
            raise
    return dst


def tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TOKENIZER))


class SampleTokenize:
    """tokenize= for the sample data: picklable, so spawned DataLoader workers can use it."""

    def __init__(self):
        self._tok = None

    def __call__(self, text: str) -> list[int]:
        if self._tok is None:
            self._tok = tokenizer()
        return self._tok.encode(text, add_special_tokens=False).ids

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._tok = None


def tokenize_fn() -> SampleTokenize:
    return SampleTokenize()


def _file_payloads(path: Path, fmt: str, column: str) -> list[Any]:
    """Every payload of one file, read whole, in file-row order."""
    if fmt == "parquet":
        return pq.read_table(path, columns=[column])[column].to_pylist()
    if fmt == "arrow":
        with pa.memory_map(str(path)) as src:
            try:
                table = pa.ipc.open_file(src).read_all()
            except pa.ArrowInvalid:
                table = pa.ipc.open_stream(src).read_all()
        return table[column].to_pylist()
    if fmt == "megatron":
        index = read_index(path.with_suffix(".idx"))
        data = open_bin(index, path)
        return [
            data[int(p) // index.itemsize : int(p) // index.itemsize + int(n)].tolist()
            for p, n in zip(index.pointers, index.sizes, strict=True)
        ]
    raw = path.read_bytes()
    if fmt == "jsonl.zst":
        raw = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True).read()
    return [json.loads(line)[column] if line.strip() else None for line in raw.split(b"\n")]


class Oracle:
    """Token ids of (source, row) from whole-file reads of the sample data."""

    def __init__(self, index: Path, *, fit_estimates: bool = True):
        self.index = Path(index)
        self.manifest = manifest_with_files(self.index)
        self.root = Path(self.manifest["root"])
        self.tok = tokenizer()
        self.fit = fit_estimates
        self._files: dict[tuple[str, int], list[Any]] = {}
        self._tables: dict[str, Any] = {}

    def tokens(self, source: str, row: int) -> np.ndarray:
        entry = next(s for s in self.manifest["sources"] if s["name"] == source)
        if source not in self._tables:
            self._tables[source] = pq.read_table(self.index / entry["table"]).to_pydict()
        table = self._tables[source]
        file_id, file_row = table["file_id"][row], table["file_row"][row]
        key = (source, file_id)
        if key not in self._files:
            item = entry["files"][file_id]
            column = entry["payload"]["column"]
            self._files[key] = _file_payloads(self.root / item["path"], entry["format"], column)
        payload = self._files[key][file_row]
        if entry["payload"]["kind"] == "text":
            payload = self.tok.encode(payload, add_special_tokens=False).ids
        ids = np.asarray(payload, dtype=np.int64)
        if not entry["length"]["exact"] and self.fit:
            ids = ids[: table["n_tokens"][row]]
        return ids


def batch_digest(batch: dict[str, Any]) -> str:
    """A hash of everything a micro-batch holds, to compare runs bit for bit."""
    h = hashlib.blake2b(digest_size=16)
    for key in sorted(batch):
        value = batch[key]
        h.update(key.encode())
        if hasattr(value, "numpy"):
            arr = value.numpy()
            h.update(str(arr.dtype).encode() + str(arr.shape).encode() + arr.tobytes())
        else:
            h.update(repr(value).encode())
    return h.hexdigest()


def text_tokenizers() -> dict[str, Any]:
    """tokenize= for the sample's text sources without a tokenizer.json in the index."""
    fn = tokenize_fn()
    return {"books": fn, "code": fn}


def open_executor(plan: Path, rank: int = 0, **kwargs: Any):
    """A PlanExecutor on the sample plan with what its sources need (tokenizers, fit)."""
    from mds.executor import PlanExecutor

    kwargs.setdefault("estimated", "fit")
    kwargs.setdefault("tokenize", text_tokenizers())
    return PlanExecutor(plan, rank, **kwargs)


_DIGESTS: dict[tuple[Path, int], list[str]] = {}


def uninterrupted(plan: Path, rank: int) -> list[str]:
    """Digests of every micro-batch of `rank`, in one uninterrupted in-process run."""
    if (plan, rank) not in _DIGESTS:
        with open_executor(plan, rank) as ex:
            _DIGESTS[(plan, rank)] = [batch_digest(b) for b in ex]
    return _DIGESTS[(plan, rank)]
