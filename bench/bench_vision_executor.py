"""Replaying image-text steps: mds's executor against webdataset's own pipeline on the same
tar shards, both decoding every image and resizing it to its Qwen2-VL grid.

Data: WebDataset shards of JPEG images (mixed sizes and aspect ratios, noise over
gradients so they compress like photos) with short captions, generated once under
`--data`. mds: `mds index` + `mds plan` (dp 1, 4 micro-batches, 32 samples a step), then
`PlanExecutor` over the steps (0 workers, in this process) and `ex.dataloader(num_workers=2)`.
Baseline: `webdataset.WebDataset(shards).decode("rgb8")`, each image resized to the same
smart_resize size with Pillow (bicubic), rescaled, normalized and cut into patch rows as the
same model's processor does, the caption tokenized with the same tokenizer, 32 samples a
step; in this process and through a torch DataLoader with 2 workers. Both read the samples
in their own order (mds the plan's, webdataset the shards'); both decode every image once.
Per-step times are medians of the steps after the first few; the ratio is mds / webdataset
in the same run.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import write_report  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SEED = 20261206
SHARDS, PER_SHARD = 4, 256
STEP = 32
STEPS = 24
SKIP = 3  # first steps left out of the medians (warm-up, worker start)
WORDS = "a the cat dog on mat red blue green house tree car sky sea".split()
MDS_TOML = """
[index]
output = "index"

[[source]]
name = "photos"
path = "shards/*.tar"
images = "jpg"
text = "txt"
tokenizer = "tokenizer.json"
weight = 1.0

[vision]
patch_size = 14
merge_size = 2
min_pixels = 3136
max_pixels = 401408

[train]
steps = {steps}
dp_size = 1
micro_batches = 4
samples_per_step = {step}
max_tokens_per_micro_batch = 16384
seed = 1

[cost]
model = {{ layers = 4, hidden = 256, vocab = 64 }}
"""


def _image(rng: np.random.Generator) -> bytes:
    from PIL import Image

    side = int(rng.choice([160, 256, 384, 512, 768, 1024], p=[0.2, 0.25, 0.2, 0.15, 0.12, 0.08]))
    aspect = float(np.exp(rng.uniform(-0.6, 0.6)))
    w, h = max(32, int(side * aspect)), max(32, int(side / aspect))
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // w), (y * 255 // h), ((x + y) * 127 // (w + h))], axis=2)
    noise = rng.integers(0, 48, (h, w, 3))
    out = io.BytesIO()
    Image.fromarray((base + noise).clip(0, 255).astype(np.uint8)).save(out, "JPEG", quality=85)
    return out.getvalue()


def make_data(data: Path) -> None:
    meta = {"shards": SHARDS, "per_shard": PER_SHARD, "seed": SEED}
    if (data / "meta.json").is_file() and json.loads((data / "meta.json").read_text()) == meta:
        return
    rng = np.random.default_rng(SEED)
    (data / "shards").mkdir(parents=True, exist_ok=True)
    for s in range(SHARDS):
        with tarfile.open(data / "shards" / f"photos-{s:04d}.tar", "w") as tar:
            for k in range(PER_SHARD):
                caption = " ".join(rng.choice(WORDS, int(rng.integers(4, 40)))).encode()
                for ext, payload in (("jpg", _image(rng)), ("txt", caption)):
                    info = tarfile.TarInfo(f"{s:04d}{k:05d}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
    vocab = {w: i for i, w in enumerate(["[UNK]", *WORDS])}
    tokenizer = {
        "version": "1.0",
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
        "pre_tokenizer": {"type": "Whitespace"},
    }
    (data / "tokenizer.json").write_text(json.dumps(tokenizer))
    (data / "mds.toml").write_text(MDS_TOML.format(steps=STEPS, step=STEP))
    mds = [sys.executable, "-m", "mds"]
    subprocess.run([*mds, "index", str(data / "mds.toml")], check=True, capture_output=True)
    subprocess.run(
        [*mds, "plan", str(data / "mds.toml"), "-o", str(data / "plan.mds")], check=True, capture_output=True
    )
    (data / "meta.json").write_text(json.dumps(meta))


def _median_ms(batches, per_step: int) -> float:
    times, t = [], time.perf_counter()
    for i, _ in enumerate(batches, 1):
        if i % per_step == 0:
            now = time.perf_counter()
            times.append(now - t)
            t = now
        if len(times) >= STEPS - 1:
            break
    return 1000 * statistics.median(times[SKIP:])


class _Baseline:
    """webdataset's pipeline to the same arrays: decode, resize, normalize, patch rows."""

    def __init__(self, data: Path):
        from mds.core.tokenizer import load_tokenizer
        from mds.core.vision import VisionGeometry

        self.shards = sorted(str(p) for p in (data / "shards").glob("*.tar"))
        self.geometry = VisionGeometry(max_pixels=401408)
        self.tokenizer = load_tokenizer(str(data / "tokenizer.json"))

    def sample(self, item):
        from PIL import Image

        rgb, text = item
        g = self.geometry
        h, w = g.resized(rgb.shape[0], rgb.shape[1])
        image = np.asarray(Image.fromarray(rgb).resize((w, h), Image.Resampling.BICUBIC), np.float32)
        image = (image / 255.0 - np.array(g.image_mean, np.float32)) / np.array(g.image_std, np.float32)
        p, m, t = g.patch_size, g.merge_size, g.temporal_patch_size
        x = np.broadcast_to(image.transpose(2, 0, 1)[None], (t, 3, h, w))
        x = x.reshape(1, t, 3, h // p // m, m, p, w // p // m, m, p).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        rows = x.reshape(-1, 3 * t * p * p)
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return rows, ids

    def dataset(self):
        import webdataset as wds

        return (
            wds.WebDataset(self.shards, shardshuffle=False, empty_check=False)
            .decode("rgb8")
            .to_tuple("jpg", "txt")
            .map(self.sample)
            .batched(STEP // 4, collation_fn=list)
        )


def run(data: Path) -> dict:
    import torch

    from mds.executor import PlanExecutor

    out = {}
    micro = 4
    with PlanExecutor(data / "plan.mds", 0) as ex:
        out["mds, 0 workers"] = _median_ms(iter(ex), micro)
    with PlanExecutor(data / "plan.mds", 0) as ex:
        out["mds, 2 workers"] = _median_ms(iter(ex.dataloader(num_workers=2)), micro)
    base = _Baseline(data)
    out["webdataset, 0 workers"] = _median_ms(iter(base.dataset()), micro)
    loader = torch.utils.data.DataLoader(base.dataset(), batch_size=None, num_workers=2)
    out["webdataset, 2 workers"] = _median_ms(iter(loader), micro)
    return out


def table(result: dict) -> str:
    lines = ["| pipeline | ms per step (median) | mds / webdataset |", "|---|---:|---:|"]
    for workers in ("0 workers", "2 workers"):
        ours, theirs = result[f"mds, {workers}"], result[f"webdataset, {workers}"]
        lines.append(f"| mds, {workers} | {ours:.1f} | {ours / theirs:.2f}x |")
        lines.append(f"| webdataset, {workers} | {theirs:.1f} | |")
    lines.append("")
    lines.append(
        f"{STEP} image-text samples a step (JPEG, 160-1024 px sides), each image decoded, "
        "resized to its smart_resize grid and cut into patch rows; medians of "
        f"{STEPS - 1 - SKIP} steps."
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    parser.add_argument("--data", type=Path, default=Path("build/bench-data/vision"))
    a = parser.parse_args()
    make_data(a.data)
    result = run(a.data)
    write_report(a.out, "vision_executor", table(result), result)


if __name__ == "__main__":
    main()
