"""Builders for the executor's vision tests: a small world of image-text samples (JSONL lines
naming PNG files, a Parquet file with an image struct column, a text-only source), indexed
and planned as text with count columns, then given the image-text payloads and a `[vision]`
geometry in the plan footer (what the planner writes for such sources), and a tokenize
function whose counts the data's count columns hold.

A plain module (tests/conftest.py puts tests/ on sys.path): `from vision_builders import ...`.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from mds.core.vision import VisionGeometry, split_segments

# Token ids: text below 600; the image tokens above, inside a vocabulary of 1024.
GEOMETRY = VisionGeometry(
    min_pixels=28 * 28,
    max_pixels=28 * 28 * 6,
    image_token_id=1000,
    vision_start_id=1001,
    vision_end_id=1002,
)
VOCAB = 1024


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


def vision_world(root: Path, *, steps: int = 6, dp_size: int = 2) -> dict[str, Any]:
    """Data under root/data, index at root/index, plan at root/plan.mds (a text plan made
    image-text in its footer). Returns {"plan", "index", "data", "images"}: images maps
    each (source, row) to the bytes of its images, in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mds.planner.index.build import build_index
    from mds.planner.index.config import load_config
    from mds.planner.plan.build import build_plan
    from mds.planner.plan.config import load_plan_config

    data = root / "data"
    (data / "img").mkdir(parents=True)
    images: dict[tuple[str, int], list[bytes]] = {}
    lines = []
    for r in range(12):
        n = r % 3  # 0, 1 or 2 images
        paths = []
        for k in range(n):
            h, w = SIZES[(r + k) % len(SIZES)]
            name = f"img/{r}-{k}.png"
            (data / name).write_bytes(png(h, w, r * 10 + k, "L" if k else "RGB"))
            paths.append(name)
        caption = f"caption {r} " * (1 + r % 4)
        if r % 2 and n:  # markers in the text: images where they are
            caption = " <image> ".join([f"part {r}.{k}" for k in range(n + 1)])
        images[("caps", r)] = [(data / p).read_bytes() for p in paths]
        lines.append({"caption": caption, "images": paths, "n": text_count(caption)})
    (data / "caps.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))

    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    texts, pics = [], []
    for r in range(10):
        h, w = SIZES[(r * 5) % len(SIZES)]
        blob = png(h, w, 500 + r, "RGBA" if r % 3 == 0 else "RGB")
        texts.append(f"<image> photo {r}" if r % 2 else f"photo {r} " * 2)
        pics.append({"bytes": blob, "path": f"{r}.png"})
        images[("pics", r)] = [blob]
    table = pa.table(
        {
            "text": texts,
            "image": pa.array(pics, type=struct),
            "n": [text_count(t) for t in texts],
        }
    )
    pq.write_table(table, data / "pics.parquet", row_group_size=4)

    plain = [{"text": f"plain text {r} " * (1 + r % 5)} for r in range(8)]
    for x in plain:
        x["n"] = len(char_tokens(x["text"]))
    (data / "plain.jsonl").write_text("".join(json.dumps(x) + "\n" for x in plain))

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
count = "n"
weight = 2

[[source]]
name = "pics"
path = "pics.parquet"
text = "text"
count = "n"
weight = 2

[[source]]
name = "plain"
path = "plain.jsonl"
text = "text"
count = "n"
weight = 1

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
    text_plan = root / "text-plan.mds"
    build_plan(load_plan_config(config), text_plan)
    plan = make_image_text(text_plan, root / "plan.mds", {"caps": "jsonl", "pics": "parquet"})
    return {"plan": plan, "index": root / "index", "data": data, "images": images}


def make_image_text(src: Path, dst: Path, layouts: dict[str, str]) -> Path:
    """Plan `src` with sources `layouts` made image-text and the test geometry: the footer
    the planner writes for such sources."""
    from executor_builders import rewrite_plan

    keys = {"jsonl": ("caption", "images"), "parquet": ("text", "image")}

    def edit(footer: dict[str, Any]) -> None:
        footer["config"]["vision"] = GEOMETRY.to_json()
        for name, layout in layouts.items():
            text, pics = keys[layout]
            footer["fetch"]["sources"][name]["payload"] = {
                "kind": "image_text",
                "layout": layout,
                "text": text,
                "images": pics,
            }

    return rewrite_plan(src, dst, footer=edit)
