"""The committed sample data must be exactly what `sample_data/generate.py` writes, and must keep
the properties the rest of the test suite relies on (token counts, heavy tail, formats)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import zstandard

from mds.formats.megatron import check_bin, read_index

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data"
SCRIPT = SAMPLE / "generate.py"
NOT_GENERATED = {"generate.py", "mds.toml", "new-mix.toml", "online.toml", "vlm.toml"}
MAX_LEN = 4096


def _files(root: Path) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.name not in NOT_GENERATED
    )


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generator's output in a fresh directory, run as a user would run it."""
    target = tmp_path_factory.mktemp("sample_data")
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(target)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return target


def _frames(data: bytes) -> list[bytes]:
    """Decompress a file of concatenated zstd frames, one entry per frame."""
    frames = []
    while data:
        dobj = zstandard.ZstdDecompressor().decompressobj()
        frames.append(dobj.decompress(data))
        assert dobj.eof, "truncated zstd frame"
        data = dobj.unused_data
    return frames


def _jsonl(data: bytes) -> list[dict]:
    text = data.decode("utf-8")
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def _texts(out: Path) -> dict[str, list[str]]:
    books = pq.read_table(out / "books" / "books.parquet").column("text").to_pylist()
    forum = [r["text"] for r in _jsonl((out / "forum" / "forum.jsonl").read_bytes())]
    code = [
        r["content"]
        for name in ("code-00000.jsonl.zst", "code-00001.jsonl.zst")
        for frame in _frames((out / "code" / name).read_bytes())
        for r in _jsonl(frame)
    ]
    wiki = _wiki(out).column("text").to_pylist()
    return {"books": books, "forum": forum, "code": code, "wiki": wiki}


def _wiki(out: Path) -> pa.Table:
    with pa.ipc.open_stream((out / "wiki" / "data-00000-of-00001.arrow").read_bytes()) as reader:
        return reader.read_all()


def _lengths(out: Path) -> dict[str, np.ndarray]:
    web = pq.read_table(sorted((out / "web").glob("*.parquet"))).column("tokens")
    books = pq.read_table(out / "books" / "books.parquet").column("n_tokens")
    texts = _texts(out)
    return {
        "web": pc.list_value_length(web).to_numpy(),
        "books": books.to_numpy(),
        "forum": np.array([len(t.split()) for t in texts["forum"]]),
        "code": np.array([len(t.split()) for t in texts["code"]]),
        "wiki": pc.list_value_length(_wiki(out).column("input_ids")).to_numpy(),
        "math": np.asarray(read_index(out / "math" / "math_text_document.idx").sizes),
    }


def _vocab_size(out: Path) -> int:
    vocab = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(len(vocab)))
    return len(vocab)


def _same_content(a: Path, b: Path) -> bool:
    """Equal bytes; for encoder-dependent formats equal decoded content is enough, so a
    newer pyarrow or libzstd on another machine does not fail the comparison."""
    if a.read_bytes() == b.read_bytes():
        return True
    if a.suffix == ".parquet":
        return pq.read_table(a).equals(pq.read_table(b))
    if a.suffix == ".arrow":
        return _read_stream(a).equals(_read_stream(b))
    if a.suffix == ".zst":
        return b"".join(_frames(a.read_bytes())) == b"".join(_frames(b.read_bytes()))
    return False


def _read_stream(path: Path) -> pa.Table:
    with pa.ipc.open_stream(path.read_bytes()) as reader:
        return reader.read_all()


def test_committed_files_match_generator(out: Path) -> None:
    generated, committed = _files(out), _files(SAMPLE)
    assert generated == committed, "file sets differ; regenerate with sample_data/generate.py"
    differ = [f for f in generated if not _same_content(out / f, SAMPLE / f)]
    assert not differ, (
        f"committed sample data differs from the generator: {differ}; run "
        f"`python sample_data/generate.py` (pyarrow {pa.__version__}, "
        f"libzstd {zstandard.ZSTD_VERSION}) and commit the result"
    )


def test_generator_is_deterministic(out: Path, tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], check=True, capture_output=True)
    assert _files(tmp_path) == _files(out)
    for f in _files(out):
        assert (tmp_path / f).read_bytes() == (out / f).read_bytes(), f


def test_total_size_is_small(out: Path) -> None:
    assert sum((out / f).stat().st_size for f in _files(out)) <= 5 * 1024 * 1024


def test_tokenizer_gives_one_id_per_word(out: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.get_vocab_size() == _vocab_size(out)
    for source, texts in _texts(out).items():
        for text, encoding in zip(texts, tok.encode_batch(texts), strict=True):
            assert len(encoding.ids) == len(text.split()), source
            assert 0 not in encoding.ids, f"{source}: a word is missing from the vocabulary"


def test_books_n_tokens_is_the_token_count(out: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    table = pq.read_table(out / "books" / "books.parquet")
    texts = table.column("text").to_pylist()
    counts = [len(e.ids) for e in tok.encode_batch(texts)]
    assert counts == table.column("n_tokens").to_pylist()
    assert all("  " not in t and t == t.strip() for t in texts)  # single spaces only


def test_wiki_input_ids_are_the_tokenized_text(out: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    table = _wiki(out)
    encoded = [e.ids for e in tok.encode_batch(table.column("text").to_pylist())]
    assert encoded == table.column("input_ids").to_pylist()


def test_heavy_tail_in_every_source(out: Path) -> None:
    for source, lengths in _lengths(out).items():
        assert lengths.min() >= 1, source
        assert 3500 < lengths.max() <= MAX_LEN, source
        assert (lengths > 2048).sum() >= 2, source
        if source != "books":  # books are the long source; the others are mostly short
            assert np.median(lengths) < 400, source


def test_web_parquet_layout_and_token_range(out: Path) -> None:
    vocab_size = _vocab_size(out)
    files = sorted((out / "web").glob("*.parquet"))
    assert [f.name for f in files] == [f"part-0000{k}.parquet" for k in range(3)]
    rows = [pq.ParquetFile(f).metadata.num_rows for f in files]
    assert len(set(rows)) == 3
    for f in files:
        meta = pq.ParquetFile(f)
        assert meta.metadata.num_row_groups > 1
        assert meta.schema_arrow.field("tokens").type == pa.list_(pa.int32())
        table = meta.read()
        ids = pc.list_flatten(table.column("tokens")).to_numpy()
        assert ids.min() >= 0 and ids.max() < vocab_size
        quality = table.column("quality").to_numpy()
        assert ((quality >= 0) & (quality <= 1)).all()
        assert set(table.column("lang").to_pylist()) <= {"en", "de", "fr", "es"}


def test_zst_files_are_jsonl_in_one_and_several_frames(out: Path) -> None:
    single = _frames((out / "code" / "code-00000.jsonl.zst").read_bytes())
    multi = _frames((out / "code" / "code-00001.jsonl.zst").read_bytes())
    assert len(single) == 1 and len(multi) > 1
    records = [r for frame in single + multi for r in _jsonl(frame)]
    assert 250 <= len(records) <= 350
    for r in records:
        assert set(r) == {"content", "repo_lang", "stars"}
        assert r["repo_lang"] in {"python", "rust", "go"} and isinstance(r["stars"], int)


def test_forum_has_one_non_ascii_row(out: Path) -> None:
    records = _jsonl((out / "forum" / "forum.jsonl").read_bytes())
    assert all(list(r) == ["id", "text", "lang", "score"] for r in records)
    wide = [r for r in records if len(r["text"].encode("utf-8")) != len(r["text"])]
    assert len(wide) == 1
    assert len({r["id"] for r in records}) == len(records)


def test_wiki_is_a_save_to_disk_directory(out: Path) -> None:
    state = json.loads((out / "wiki" / "state.json").read_text(encoding="utf-8"))
    assert state["_data_files"] == [{"filename": "data-00000-of-00001.arrow"}]
    info = json.loads((out / "wiki" / "dataset_info.json").read_text(encoding="utf-8"))
    assert set(info["features"]) == set(_wiki(out).column_names)


def test_math_is_a_valid_megatron_dataset(out: Path) -> None:
    prefix = out / "math" / "math_text_document"
    index = read_index(prefix.with_suffix(".idx"))
    check_bin(index, prefix.with_suffix(".bin"))
    assert index.dtype == np.uint16 and len(index) == 250
