"""Generate the small multi-source sample dataset committed next to this script.

One source per common on-disk format (Parquet, JSONL, zstd JSONL, HF save_to_disk, Megatron),
heavy-tailed lengths up to 4096 tokens. Deterministic: the same bytes on every run.
Usage: python sample_data/generate.py [OUT_DIR]   (default: this script's folder)
"""

from __future__ import annotations

import json
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from mds.formats.megatron import write_dataset

SEED = 20240601
MAX_LEN = 4096
N_WORDS = 2000
UNK = "[UNK]"
# Real-looking accented words, used by exactly one forum row to make bytes != characters.
ACCENTED = (
    "café",
    "crème",
    "déjà",
    "élan",
    "façade",
    "fiancée",
    "garçon",
    "naïve",
    "señor",
    "über",
)
LANGS = ("en", "de", "fr", "es")
LANG_P = (0.70, 0.13, 0.10, 0.07)
ROW_GROUP = 64
PARQUET_ZSTD_LEVEL = 3
JSONL_ZSTD_LEVEL = 10
FRAME_LINES = 50
WIKI_FINGERPRINT = "5d0c3b1e8a7f4a92"


@dataclass(frozen=True)
class Stats:
    """One row of the README table."""

    name: str
    path: str
    fmt: str
    length: str
    metadata: str
    lengths: np.ndarray


# --- vocabulary and token sampling -------------------------------------------------------


def rng_for(name: str) -> np.random.Generator:
    """An independent, stable stream per part, so changing one source leaves the rest alone."""
    return np.random.default_rng([SEED, zlib.crc32(name.encode())])


def make_words() -> list[str]:
    """N_WORDS made-up lowercase words of 1-3 syllables, ordered short-first like a frequency list."""
    rng = rng_for("vocab")
    syllables = [c + v for c in "bdfghklmnprstvz" for v in "aeiou"]
    words: set[str] = set()
    while len(words) < N_WORDS:
        n_syllables = int(rng.choice([1, 2, 3], p=[0.05, 0.55, 0.40]))
        words.add("".join(rng.choice(syllables, size=n_syllables)))
    return sorted(words, key=lambda w: (len(w), w))


def make_vocab(words: list[str]) -> list[str]:
    """Id order: [UNK] = 0, the made-up words (ids 1..N_WORDS), then the accented words."""
    return [UNK, *words, *ACCENTED]


def zipf_p(n: int, exponent: float = 1.1, shift: float = 2.7) -> np.ndarray:
    """Zipf-Mandelbrot probabilities over ranks 1..n (rank 1 = token id 1 is most frequent)."""
    weights = 1.0 / (np.arange(1, n + 1) + shift) ** exponent
    return weights / weights.sum()


def sample_ids(rng: np.random.Generator, n_tokens: int) -> np.ndarray:
    """Token ids of the made-up words (never [UNK], never the accented words)."""
    return (rng.choice(N_WORDS, size=n_tokens, p=zipf_p(N_WORDS)) + 1).astype(np.int32)


def heavy_tailed_lengths(
    rng: np.random.Generator, n: int, median: float, sigma: float, n_long: int = 3
) -> np.ndarray:
    """Log-normal lengths clipped to [1, MAX_LEN]; `n_long` rows forced above 2048, one > 3500."""
    lengths = np.clip(np.rint(rng.lognormal(np.log(median), sigma, n)), 1, MAX_LEN)
    lengths = lengths.astype(np.int64)
    slots = rng.choice(n, size=n_long, replace=False)
    lengths[slots[0]] = rng.integers(3501, MAX_LEN + 1)
    lengths[slots[1:]] = rng.integers(2049, 3501, size=n_long - 1)
    return lengths


def split_rows(flat: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    return np.split(flat, np.cumsum(lengths)[:-1])


def rows_of_ids(rng: np.random.Generator, lengths: np.ndarray) -> list[np.ndarray]:
    return split_rows(sample_ids(rng, int(lengths.sum())), lengths)


def langs(rng: np.random.Generator, n: int) -> list[str]:
    return [str(x) for x in rng.choice(LANGS, size=n, p=LANG_P)]


class Text:
    """Turns token ids into text: words separated by single spaces."""

    def __init__(self, vocab: list[str]) -> None:
        self.vocab = np.array(vocab, dtype=object)

    def __call__(self, ids: np.ndarray) -> str:
        return " ".join(self.vocab[ids])


# --- writers --------------------------------------------------------------------------------


def write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def write_parquet(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        table,
        path,
        row_group_size=ROW_GROUP,
        version="2.6",
        data_page_version="1.0",
        compression="zstd",
        compression_level=PARQUET_ZSTD_LEVEL,
        use_dictionary=True,
        write_statistics=True,
        store_schema=True,
    )


def jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def json_bytes(obj: object) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def list_array(rows: list[np.ndarray]) -> pa.ListArray:
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int32)
    values = np.concatenate(rows).astype(np.int32) if rows else np.empty(0, np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa.int32()))


def zstd_compressor() -> zstandard.ZstdCompressor:
    return zstandard.ZstdCompressor(level=JSONL_ZSTD_LEVEL, write_checksum=True, threads=0)


# --- sources --------------------------------------------------------------------------------


def tokenizer_json(vocab: list[str]) -> dict:
    """A Hugging Face `tokenizers` WordLevel tokenizer: one id per whitespace-separated word."""
    unk = {
        "id": 0,
        "content": UNK,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [unk],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {
            "type": "WordLevel",
            "vocab": {w: i for i, w in enumerate(vocab)},
            "unk_token": UNK,
        },
    }


def write_tokenizer(out: Path, vocab: list[str]) -> None:
    # Not sort_keys: the field order and the id order of the vocab are those `tokenizers` writes.
    text = json.dumps(tokenizer_json(vocab), indent=2, ensure_ascii=False) + "\n"
    write_bytes(out / "tokenizer.json", text.encode("utf-8"))


def make_web(out: Path, text: Text) -> Stats:
    rng = rng_for("web")
    parts = (300, 250, 200)
    lengths = heavy_tailed_lengths(rng, sum(parts), median=160, sigma=1.0)
    rows = rows_of_ids(rng, lengths)
    lang = langs(rng, len(rows))
    quality = rng.beta(2.0, 3.0, size=len(rows))
    tlds = (".com", ".org", ".net", ".io")
    urls = [
        f"https://{text(r[:1])}{tlds[i % len(tlds)]}/{text(r[1:3]).replace(' ', '-')}/{i}"
        for i, r in enumerate(rows)
    ]
    schema = pa.schema(
        [
            ("tokens", pa.list_(pa.int32())),
            ("lang", pa.string()),
            ("quality", pa.float64()),
            ("url", pa.string()),
        ]
    )
    start = 0
    for k, n in enumerate(parts):
        sl = slice(start, start + n)
        table = pa.Table.from_arrays(
            [list_array(rows[sl]), pa.array(lang[sl]), pa.array(quality[sl]), pa.array(urls[sl])],
            schema=schema,
        )
        write_parquet(out / "web" / f"part-{k:05d}.parquet", table)
        start += n
    return Stats(
        "web",
        "web/part-0000{0,1,2}.parquet",
        "Parquet, 3 files",
        "`len(tokens)`",
        "lang, quality, url",
        lengths,
    )


def make_books(out: Path, text: Text) -> Stats:
    rng = rng_for("books")
    lengths = heavy_tailed_lengths(rng, 120, median=1400, sigma=0.6)
    rows = rows_of_ids(rng, lengths)
    titles = [" ".join(w.capitalize() for w in text(r[-3:]).split()) for r in rows]
    table = pa.table(
        {
            "text": pa.array([text(r) for r in rows], pa.string()),
            "n_tokens": pa.array(lengths, pa.int64()),
            "lang": pa.array(langs(rng, len(rows)), pa.string()),
            "title": pa.array(titles, pa.string()),
        }
    )
    write_parquet(out / "books" / "books.parquet", table)
    return Stats(
        "books", "books/books.parquet", "Parquet", "`n_tokens` column", "lang, title", lengths
    )


def accented_text(rng: np.random.Generator, ids: np.ndarray, text: Text) -> str:
    """Every third word replaced by an accented one: non-ASCII, still one token per word."""
    words = text(ids).split(" ")
    for k in range(0, len(words), 3):
        words[k] = ACCENTED[int(rng.integers(len(ACCENTED)))]
    return " ".join(words)


def make_forum(out: Path, text: Text) -> Stats:
    rng = rng_for("forum")
    n = 400
    lengths = heavy_tailed_lengths(rng, n, median=90, sigma=0.9)
    rows = rows_of_ids(rng, lengths)
    ids = np.sort(rng.choice(np.arange(10_000, 100_000), size=n, replace=False))
    lang = langs(rng, n)
    scores = rng.geometric(0.15, size=n) - 3
    special = int(rng.integers(n))
    records = [
        {
            "id": int(ids[i]),
            "text": accented_text(rng, rows[i], text) if i == special else text(rows[i]),
            "lang": "fr" if i == special else lang[i],
            "score": int(scores[i]),
        }
        for i in range(n)
    ]
    write_bytes(out / "forum" / "forum.jsonl", jsonl(records))
    return Stats(
        "forum", "forum/forum.jsonl", "JSONL", "tokenize `text`", "id, lang, score", lengths
    )


def code_layout(rng: np.random.Generator, words: list[str]) -> str:
    """Lay words out as indented lines, like source code (whitespace still splits the words)."""
    lines, k = [], 0
    while k < len(words):
        width = int(rng.integers(2, 9))
        indent = "    " * int(rng.choice(3, p=[0.5, 0.35, 0.15]))
        lines.append(indent + " ".join(words[k : k + width]))
        k += width
    return "\n".join(lines) + "\n"


def make_code(out: Path, text: Text) -> Stats:
    rng = rng_for("code")
    parts = (180, 120)
    lengths = heavy_tailed_lengths(rng, sum(parts), median=160, sigma=1.0)
    rows = rows_of_ids(rng, lengths)
    repo_lang = rng.choice(["python", "rust", "go"], size=len(rows), p=[0.5, 0.3, 0.2])
    stars = np.floor(rng.pareto(1.2, size=len(rows)) * 20).astype(np.int64)
    records = [
        {"content": code_layout(rng, text(r).split(" ")), "repo_lang": str(lg), "stars": int(s)}
        for r, lg, s in zip(rows, repo_lang, stars, strict=True)
    ]
    first, second = records[: parts[0]], records[parts[0] :]
    cctx = zstd_compressor()
    write_bytes(out / "code" / "code-00000.jsonl.zst", cctx.compress(jsonl(first)))
    frames = [
        cctx.compress(jsonl(second[k : k + FRAME_LINES]))
        for k in range(0, len(second), FRAME_LINES)
    ]
    write_bytes(out / "code" / "code-00001.jsonl.zst", b"".join(frames))
    return Stats(
        "code",
        "code/code-0000{0,1}.jsonl.zst",
        "zstd JSONL (1 frame; 3 frames)",
        "tokenize `content`",
        "repo_lang, stars",
        lengths,
    )


WIKI_FEATURES = {
    "text": {"dtype": "string", "_type": "Value"},
    "input_ids": {"feature": {"dtype": "int32", "_type": "Value"}, "_type": "Sequence"},
    "lang": {"dtype": "string", "_type": "Value"},
}


def wiki_stream(rows: list[np.ndarray], lang: list[str], text: Text) -> bytes:
    """Arrow IPC stream as `datasets.save_to_disk` writes it, HF features in schema metadata."""
    meta = {"huggingface": json.dumps({"info": {"features": WIKI_FEATURES}})}
    schema = pa.schema(
        [("text", pa.string()), ("input_ids", pa.list_(pa.int32())), ("lang", pa.string())],
        metadata=meta,
    )
    table = pa.Table.from_arrays(
        [pa.array([text(r) for r in rows]), list_array(rows), pa.array(lang)], schema=schema
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in table.to_batches(max_chunksize=ROW_GROUP):
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def make_wiki(out: Path, text: Text) -> Stats:
    rng = rng_for("wiki")
    lengths = heavy_tailed_lengths(rng, 200, median=250, sigma=0.8)
    rows = rows_of_ids(rng, lengths)
    data_file = "data-00000-of-00001.arrow"
    state = {
        "_data_files": [{"filename": data_file}],
        "_fingerprint": WIKI_FINGERPRINT,
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    info = {
        "citation": "",
        "description": "",
        "features": WIKI_FEATURES,
        "homepage": "",
        "license": "",
    }
    write_bytes(out / "wiki" / data_file, wiki_stream(rows, langs(rng, len(rows)), text))
    write_bytes(out / "wiki" / "state.json", json_bytes(state))
    write_bytes(out / "wiki" / "dataset_info.json", json_bytes(info))
    return Stats(
        "wiki", "wiki/", "HF `save_to_disk` (Arrow stream)", "`len(input_ids)`", "lang", lengths
    )


def make_math(out: Path, text: Text) -> Stats:
    rng = rng_for("math")
    lengths = heavy_tailed_lengths(rng, 250, median=110, sigma=1.1)
    rows = rows_of_ids(rng, lengths)
    (out / "math").mkdir(parents=True, exist_ok=True)
    write_dataset(out / "math" / "math_text_document", rows, dtype=np.uint16)
    return Stats(
        "math",
        "math/math_text_document.{bin,idx}",
        "Megatron indexed (uint16)",
        "`.idx` sizes",
        "none",
        lengths,
    )


# --- image-text (docs/vision.md) -----------------------------------------------------------

# (width, height) of the drawn images: small to large, several aspect ratios.
VLM_SIZES = (
    (32, 32), (48, 64), (64, 48), (96, 96), (128, 72), (160, 120), (200, 300), (224, 224),
    (256, 192), (320, 180), (300, 400), (448, 448), (512, 256), (640, 480), (720, 405),
)  # fmt: skip
VLM_LARGE = ((1200, 800), (800, 1200), (1024, 768))
VLM_JPEG_QUALITY = 60
MARKER = "<image>"
TAR_BLOCK = 512


def draw_image(rng: np.random.Generator, size: tuple[int, int], fmt: str) -> bytes:
    """A few flat shapes on a flat background (compresses to a few KB), encoded by Pillow."""
    import io

    from PIL import Image, ImageDraw

    w, h = size
    color = tuple(int(c) for c in rng.integers(0, 256, 3))
    image = Image.new("RGB", size, color)  # type: ignore[arg-type]
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(2, 6))):
        x0, x1 = sorted(int(v) for v in rng.integers(0, w, 2))
        y0, y1 = sorted(int(v) for v in rng.integers(0, h, 2))
        fill = tuple(int(c) for c in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            draw.rectangle((x0, y0, x1, y1), fill=fill)  # type: ignore[arg-type]
        else:
            draw.ellipse((x0, y0, x1, y1), fill=fill)  # type: ignore[arg-type]
    out = io.BytesIO()
    if fmt == "jpg":
        image.save(out, format="JPEG", quality=VLM_JPEG_QUALITY)
    else:
        image.save(out, format="PNG", optimize=False, compress_level=9)
    return out.getvalue()


def vlm_sample(rng: np.random.Generator, text: Text, i: int) -> tuple[list[tuple[str, bytes]], str]:
    """One image-text sample: 0-2 images (jpg or png, a large one now and then) and a caption
    of heavy-tailed length; some captions place the images with markers."""
    n_images = int(rng.choice([0, 1, 2], p=[0.12, 0.63, 0.25]))
    images = []
    for _ in range(n_images):
        if rng.random() < 0.06:
            size = VLM_LARGE[int(rng.integers(len(VLM_LARGE)))]
        else:
            size = VLM_SIZES[int(rng.integers(len(VLM_SIZES)))]
        fmt = "jpg" if rng.random() < 0.7 else "png"
        images.append((fmt, draw_image(rng, size, fmt)))
    n_words = int(np.clip(np.rint(rng.lognormal(np.log(24), 0.9)), 1, 600))
    words = text(sample_ids(rng, n_words)).split(" ")
    if n_images and rng.random() < 0.4:  # markers: one per image, at word boundaries
        cuts = sorted(int(c) for c in rng.integers(0, len(words) + 1, n_images))
        pieces, at = [], 0
        for c in cuts:
            pieces.append(" ".join(words[at:c]))
            at = c
        pieces.append(" ".join(words[at:]))
        caption = f" {MARKER} ".join(pieces).strip()
    else:
        caption = " ".join(words)
    return images, caption


def tar_member(name: str, data: bytes) -> bytes:
    """A ustar member (header + data padded to the block), fixed metadata: deterministic."""
    import tarfile

    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    info.uname = info.gname = ""
    header = info.tobuf(format=tarfile.USTAR_FORMAT)
    return header + data + bytes(-len(data) % TAR_BLOCK)


def caption_words(caption: str) -> int:
    """Tokens of a caption as the index counts them: the words between the markers."""
    return sum(len(piece.split()) for piece in caption.split(MARKER))


def make_captions(out: Path, text: Text) -> Stats:
    """WebDataset shards: per sample `key.txt` and the images as `key.jpg` / `key.png`, or
    `key.0.jpg`, `key.1.png` for two."""
    rng = rng_for("vlm-captions")
    shards = (26, 22)
    lengths = []
    at = 0
    for s, count in enumerate(shards):
        body = []
        for i in range(at, at + count):
            images, caption = vlm_sample(rng, text, i)
            key = f"cap{i:05d}"
            names = (
                [f"{key}.{images[0][0]}"]
                if len(images) == 1
                else [f"{key}.{k}.{fmt}" for k, (fmt, _) in enumerate(images)]
            )
            for name, (_, data) in zip(names, images, strict=True):
                body.append(tar_member(name, data))
            body.append(tar_member(f"{key}.txt", caption.encode("utf-8")))
            lengths.append(caption_words(caption))
        at += count
        write_bytes(
            out / "vlm" / "captions" / f"captions-{s:05d}.tar",
            b"".join(body) + bytes(2 * TAR_BLOCK),
        )
    return Stats(
        "captions",
        "vlm/captions/captions-0000{0,1}.tar",
        "WebDataset tar, 2 shards",
        "tokenize `txt`",
        "none",
        np.array(lengths),
    )


def make_charts(out: Path, text: Text) -> Stats:
    """Parquet in the Hugging Face layout: `image` is a struct of bytes and path."""
    rng = rng_for("vlm-charts")
    rows = 20
    images, captions, lang, lengths = [], [], [], []
    for i in range(rows):
        imgs, caption = vlm_sample(rng, text, i)
        imgs = imgs[:1]  # one image column: a struct, or null for a text-only row
        caption = caption.replace(MARKER, "").replace("  ", " ").strip() or "chart"
        images.append({"bytes": imgs[0][1], "path": f"chart{i:03d}.{imgs[0][0]}"} if imgs else None)
        captions.append(caption)
        lengths.append(caption_words(caption))
    lang = langs(rng, rows)
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table(
        {
            "image": pa.array(images, type=image_type),
            "text": pa.array(captions, type=pa.string()),
            "lang": pa.array(lang, type=pa.string()),
        }
    )
    write_parquet(out / "vlm" / "charts" / "charts-00000.parquet", table)
    return Stats(
        "charts",
        "vlm/charts/charts-00000.parquet",
        "Parquet, HF image struct",
        "tokenize `text`",
        "lang",
        np.array(lengths),
    )


VLM_SOURCES: tuple[Callable[[Path, Text], Stats], ...] = (make_captions, make_charts)


SOURCES: tuple[Callable[[Path, Text], Stats], ...] = (
    make_web,
    make_books,
    make_forum,
    make_code,
    make_wiki,
    make_math,
)


# --- README -----------------------------------------------------------------------------


def readme(stats: list[Stats], vocab_size: int, vlm: list[Stats]) -> str:
    head = [
        "# Sample data",
        "",
        "A small multi-source dataset in the on-disk formats mds reads, with heavy-tailed",
        f"lengths (most samples short, a few close to the {MAX_LEN}-token context).",
        f"`tokenizer.json` is a word-level tokenizer ({vocab_size} ids, `[UNK]` = 0) with one id",
        "per whitespace-separated word, so a text's token count is its word count.",
        "",
        "| source | path | format | length from | metadata | rows | tokens | max len |",
        "|---|---|---|---|---|---:|---:|---:|",
    ]
    body = [
        f"| {s.name} | `{s.path}` | {s.fmt} | {s.length} | {s.metadata} | {len(s.lengths)} "
        f"| {int(s.lengths.sum())} | {int(s.lengths.max())} |"
        for s in stats
    ]
    rows = sum(len(s.lengths) for s in stats)
    tokens = sum(int(s.lengths.sum()) for s in stats)
    tail = [
        f"| **total** | | | | | {rows} | {tokens} | |",
        "",
        "## Image-text (`vlm.toml`)",
        "",
        "Images drawn with Pillow (flat shapes; 32x32 up to 1200x800, JPEG and PNG), 0-2 per",
        "sample, captions of the same made-up words; some captions place their images with",
        f"`{MARKER}` markers. `vlm.toml` indexes both sources and sets a small `[vision]`",
        "geometry (docs/vision.md); tokens below are the captions' (images not included).",
        "",
        "| source | path | format | length from | metadata | rows | tokens | max len |",
        "|---|---|---|---|---|---:|---:|---:|",
        *[
            f"| {s.name} | `{s.path}` | {s.fmt} | {s.length} | {s.metadata} | {len(s.lengths)} "
            f"| {int(s.lengths.sum())} | {int(s.lengths.max())} |"
            for s in vlm
        ],
        "",
        "The files are generated, deterministically (same bytes every run), and committed.",
        "Regenerate with `python sample_data/generate.py`; `tests/sample_data/test_generate.py`",
        "checks that the committed files match the generator.",
    ]
    return "\n".join(head + body + tail) + "\n"


def generate(out: Path) -> list[Stats]:
    vocab = make_vocab(make_words())
    text = Text(vocab)
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(out, vocab)
    stats = [make(out, text) for make in SOURCES]
    vlm = [make(out, text) for make in VLM_SOURCES]
    write_bytes(out / "README.md", readme(stats, len(vocab), vlm).encode("utf-8"))
    return stats


def main(argv: list[str]) -> None:
    out = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent
    for s in generate(out):
        print(
            f"{s.name:6s} rows={len(s.lengths):4d} tokens={int(s.lengths.sum()):7d} "
            f"max={int(s.lengths.max())}"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv)
