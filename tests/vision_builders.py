"""Builders for the executor's vision tests: a small world of image-text samples (JSONL lines
naming PNG files, a Parquet file with an image struct column, a WebDataset shard, a
text-only source) indexed with count columns and planned with a small `[vision]` geometry,
and a tokenize function whose counts the data's count columns hold.

A plain module (tests/conftest.py puts tests/ on sys.path): `from vision_builders import ...`.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from mds.core.vision import VisionGeometry, split_segments

# Token ids: text below the sample tokenizer's 2011; the image tokens above, inside a
# vocabulary of 2112.
GEOMETRY = VisionGeometry(
    min_pixels=28 * 28,
    max_pixels=28 * 28 * 6,
    image_token_id=2100,
    vision_start_id=2101,
    vision_end_id=2102,
)
VOCAB = 2112
TOKENIZER = Path(__file__).resolve().parents[1] / "sample_data" / "tokenizer.json"


def char_tokens(text: str) -> list[int]:
    """One token a character (module-level: DataLoader workers may pickle it)."""
    return [ord(c) % 590 + 10 for c in text]


def text_count(text: str, marker: str = GEOMETRY.marker) -> int:
    return sum(len(char_tokens(p)) for p in split_segments(text, marker))


def png(h: int, w: int, seed: int, mode: str = "RGB") -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    if mode != "RGB":
        image = image.convert(mode)
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


SIZES = [(40, 60), (90, 30), (28, 28), (120, 100), (50, 50), (33, 70)]


def write_shard(path: Path, samples: list[tuple[str, dict[str, bytes]]]) -> None:
    """A WebDataset shard: each (key, {extension: data}) as members `key.extension`."""
    import tarfile

    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def vision_world(root: Path, *, steps: int = 6, dp_size: int = 2) -> dict[str, Any]:
    """Data under root/data, index at root/index, plan at root/plan.mds (made with `[vision]`
    = GEOMETRY). Returns {"plan", "index", "data", "images", "texts"}: by (source, row), the
    bytes of its images in order, and its text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mds.planner.index.build import build_index
    from mds.planner.index.config import load_config
    from mds.planner.plan.build import build_plan
    from mds.planner.plan.config import load_plan_config

    data = root / "data"
    (data / "img").mkdir(parents=True)
    images: dict[tuple[str, int], list[bytes]] = {}
    texts: dict[tuple[str, int], str] = {}

    lines = []  # JSONL naming image files: 0, 1 or 2 images, with markers or without
    for r in range(12):
        paths = []
        for k in range(r % 3):
            h, w = SIZES[(r + k) % len(SIZES)]
            name = f"img/{r}-{k}.png"
            (data / name).write_bytes(png(h, w, r * 10 + k, "L" if k else "RGB"))
            paths.append(name)
        caption = f"caption {r} " * (1 + r % 4)
        if r % 2 and paths:
            caption = " <image> ".join([f"part {r}.{k}" for k in range(len(paths) + 1)])
        images[("caps", r)] = [(data / p).read_bytes() for p in paths]
        texts[("caps", r)] = caption
        lines.append({"caption": caption, "images": paths, "n": text_count(caption)})
    (data / "caps.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))

    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    pics = []  # Parquet with an image struct column
    for r in range(10):
        h, w = SIZES[(r * 5) % len(SIZES)]
        blob = png(h, w, 500 + r, "RGBA" if r % 3 == 0 else "RGB")
        texts[("pics", r)] = f"<image> photo {r}" if r % 2 else f"photo {r} " * 2
        images[("pics", r)] = [blob]
        pics.append({"bytes": blob, "path": f"{r}.png"})
    column = [texts[("pics", r)] for r in range(10)]
    table = pa.table(
        {
            "text": column,
            "image": pa.array(pics, type=struct),
            "n": [text_count(t) for t in column],
        }
    )
    pq.write_table(table, data / "pics.parquet", row_group_size=4)

    shard = []  # a WebDataset shard: one or two images (jpg member, then "1.png")
    for r in range(9):
        text = f"<image> shot {r}" if r % 3 == 1 else f"shot {r} " * 2
        members = {"txt": text.encode()}
        blobs = []
        for k in range(1 + (r % 3 != 1) * (r % 2)):
            h, w = SIZES[(r + 2 * k) % len(SIZES)]
            blobs.append(png(h, w, 900 + r * 3 + k))
            members[f"{k}.png" if k else "jpg"] = blobs[-1]
        images[("shots", r)] = blobs
        texts[("shots", r)] = text
        shard.append((f"shots/{r:04d}", members))
    write_shard(data / "shots.tar", shard)

    plain = [{"text": f"plain text {r} " * (1 + r % 5)} for r in range(8)]
    for r, x in enumerate(plain):
        x["n"] = len(char_tokens(x["text"]))
        texts[("plain", r)] = x["text"]
    (data / "plain.jsonl").write_text("".join(json.dumps(x) + "\n" for x in plain))

    g = GEOMETRY
    config = data / "mds.toml"
    config.write_text(
        f"""
[index]
root = "."
output = "{root / "index"}"

[[source]]
name = "caps"
path = "caps.jsonl"
text = "caption"
images = "images"
count = "n"
weight = 2

[[source]]
name = "pics"
path = "pics.parquet"
text = "text"
images = "image"
count = "n"
weight = 2

[[source]]
name = "shots"
path = "shots.tar"
text = "txt"
images = "jpg;png"
tokenizer = "{TOKENIZER}"
weight = 2

[[source]]
name = "plain"
path = "plain.jsonl"
text = "text"
count = "n"
weight = 1

[vision]
min_pixels = {g.min_pixels}
max_pixels = {g.max_pixels}
image_token_id = {g.image_token_id}
vision_start_id = {g.vision_start_id}
vision_end_id = {g.vision_end_id}

[train]
steps = {steps}
dp_size = {dp_size}
micro_batches = 2
samples_per_step = 8
max_tokens_per_micro_batch = 512
seed = 3

[plan]
chunk_steps = 2
"""
    )
    build_index(load_config(config), root / "index", workers=1)
    build_plan(load_plan_config(config), root / "plan.mds")
    return {
        "plan": root / "plan.mds",
        "index": root / "index",
        "data": data,
        "images": images,
        "texts": texts,
    }


def make_image_text(src: Path, dst: Path, layouts: dict[str, str]) -> Path:
    """Plan `src` with the payload layout of sources `layouts` replaced (a forged footer)."""
    from executor_builders import rewrite_plan

    def edit(footer: dict[str, Any]) -> None:
        for name, layout in layouts.items():
            footer["fetch"]["sources"][name]["payload"]["layout"] = layout

    return rewrite_plan(src, dst, footer=edit)
