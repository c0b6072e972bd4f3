"""Benchmark indexing WebDataset tar shards (image-text, docs/vision.md) against a plain
sequential read of the same tars.

Synthetic shards are written once under a temporary directory (or `--data`): JPEG images of
mixed sizes (64x64 up to 1600x1200, drawn once with Pillow and reused) with 1-2 images and a
caption of ~10-200 words per sample, `--mb` MB in `--shards` shards. Then, warm cache, the
median of `--repeat` rounds of:

  read      every shard read front to back in 16 MiB reads (one thread): the baseline
  scan      `scan_webdataset` on every shard, one after the other (one thread): member
            headers, image headers, captions tokenized with sample_data/tokenizer.json
  scan, estimate   the same with `estimate = "bytes/4"`: no tokenizer
  build -jN `build_index` into a fresh directory with N workers (fingerprints, table, manifest)

The same read and scan again "cold": the shards dropped from the page cache
(POSIX_FADV_DONTNEED) before each run, so both read the disk, as shards on storage are.
MB/s is MB (10^6 bytes) of tar files per second; "vs read" divides by the baseline's (the
cold read's for the cold rows).
Results go to `<out>/vision_index.md` and `<out>/vision_index.json`. Timings are reported,
never asserted.

Usage: python bench/bench_vision_index.py --out build/bench [--mb 200] [--repeat 3]
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import shutil
import statistics
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
from report import write_report  # noqa: E402  (bench/ is on sys.path when run)

from mds.planner.index.build import build_index
from mds.planner.index.config import parse_config
from mds.planner.index.discover import DataFile
from mds.planner.index.scan import ScanContext
from mds.planner.index.webdataset import scan_webdataset

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "sample_data" / "tokenizer.json"
SEED = 20250701
MB = 1e6
READ_CHUNK = 16 << 20
SIZES = [(64, 64), (224, 224), (320, 240), (448, 336), (640, 480), (800, 600), (1024, 768),
         (1280, 720), (1600, 1200), (480, 640), (720, 1280)]  # fmt: skip
WORDS = ["a", "photo", "of", "the", "red", "cat", "on", "mat", "<image>"]


def _images(rng: np.random.Generator) -> list[bytes]:
    """JPEGs of every size, with smooth content plus noise (a photo-like size on disk)."""
    from PIL import Image

    out = []
    for w, h in SIZES:
        for _ in range(3):
            y, x = np.mgrid[0:h, 0:w]
            base = np.stack([(x * 255 // w), (y * 255 // h), ((x + y) * 127 // (w + h))], axis=-1)
            noise = rng.integers(0, 48, size=(h, w, 3))
            pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, format="JPEG", quality=80)
            out.append(buf.getvalue())
    return out


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), 0
    tar.addfile(info, io.BytesIO(data))


def generate(directory: Path, total_mb: float, shards: int) -> list[Path]:
    rng = np.random.default_rng(SEED)
    images = _images(rng)
    words = np.array([w for w in WORDS if w != "<image>"])
    per_shard = total_mb * MB / shards
    paths = []
    key = 0
    for s in range(shards):
        path = directory / "shards" / f"shard-{s:05d}.tar"
        path.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            while tar.offset < per_shard:
                n = int(rng.choice([1, 2], p=[0.7, 0.3]))
                picks = rng.integers(0, len(images), n)
                for k, i in enumerate(picks):
                    _member(tar, f"s{key:08d}.{k}.jpg" if n > 1 else f"s{key:08d}.jpg", images[i])
                caption = " ".join(words[rng.integers(0, len(words), int(rng.integers(10, 200)))])
                _member(tar, f"s{key:08d}.txt", caption.encode())
                key += 1
        paths.append(path)
    return paths


def read_all(paths: list[Path]) -> int:
    buf = bytearray(READ_CHUNK)
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total


def scan_all(paths: list[Path], root: Path, config) -> int:
    spec = config.sources[0]
    ctx = ScanContext(spec, TOKENIZER)
    rows = 0
    for path in paths:
        got = scan_webdataset(DataFile(path, path.relative_to(root).as_posix(), "webdataset"), ctx)
        rows += got.frame.height
    return rows


def evict(paths: list[Path]) -> None:
    """Drop the shards from the page cache (POSIX_FADV_DONTNEED), so the next read comes
    from the disk: the case of shards on storage, not in memory."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(fn, repeat: int, before=None) -> tuple[float, list[float]]:
    fn()  # warm-up: page cache, tokenizer, imports
    times = []
    for _ in range(repeat):
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "build" / "bench")
    parser.add_argument("--data", type=Path, default=None, help="where to write the shards")
    parser.add_argument("--mb", type=float, default=200.0)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    tmp = None
    if args.data is None:
        tmp = tempfile.mkdtemp(prefix="mds-bench-vision-")
        root = Path(tmp)
    else:
        root = args.data
        root.mkdir(parents=True, exist_ok=True)
    try:
        t = time.perf_counter()
        paths = generate(root, args.mb, args.shards)
        generated = time.perf_counter() - t
        size = sum(p.stat().st_size for p in paths)
        config = parse_config(
            {
                "source": [
                    {
                        "name": "caps",
                        "path": "shards/*.tar",
                        "images": "jpg",
                        "text": "txt",
                        "tokenizer": str(TOKENIZER),
                    }
                ]
            },
            base=root,
        )
        from mds.planner.index.config import resolve_format

        scan_config = type(config)(root, (resolve_format(config.sources[0], "webdataset"),))
        estimate = parse_config(
            {
                "source": [
                    {
                        "name": "caps",
                        "path": "shards/*.tar",
                        "images": "jpg",
                        "text": "txt",
                        "estimate": "bytes/4",
                    }
                ]
            },
            base=root,
        )
        estimate = type(config)(root, (resolve_format(estimate.sources[0], "webdataset"),))
        results = {}
        results["read"] = timed(lambda: read_all(paths), args.repeat)
        results["scan"] = timed(lambda: scan_all(paths, root, scan_config), args.repeat)
        results["scan, estimate"] = timed(lambda: scan_all(paths, root, estimate), args.repeat)
        cold = (lambda: evict(paths)) if hasattr(os, "posix_fadvise") else None
        if cold is not None:
            results["read, cold"] = timed(lambda: read_all(paths), args.repeat, cold)
            results["scan, cold"] = timed(lambda: scan_all(paths, root, scan_config), args.repeat, cold)
        rows = scan_all(paths, root, scan_config)
        for workers in (1, 2):

            def build(workers=workers) -> None:
                out = root / f"index-{workers}"
                shutil.rmtree(out, ignore_errors=True)
                build_index(config, out, workers=workers)

            results[f"build -j{workers}"] = timed(build, args.repeat)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    base = size / MB / results["read"][0]
    cold_base = size / MB / results["read, cold"][0] if "read, cold" in results else base
    lines = [
        f"Indexing WebDataset shards: {len(paths)} tars, {size / MB:.0f} MB, {rows} samples "
        f"(JPEG 64x64..1600x1200, 1-2 per sample); median of {args.repeat}; \"cold\": the shards "
        "dropped from the page cache before each run, read from disk; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "",
        "| what | seconds | MB/s | vs read |",
        "|---|---:|---:|---:|",
    ]
    for name, (secs, _) in results.items():
        rate = size / MB / secs
        against = cold_base if name.endswith("cold") else base
        lines.append(f"| {name} | {secs:.3f} | {rate:.0f} | {rate / against:.2f}x |")
    table = "\n".join(lines) + "\n"
    write_report(
        args.out,
        "vision_index",
        table,
        {
            "bytes": size,
            "samples": rows,
            "shards": len(paths),
            "generate_seconds": generated,
            "runs": {k: {"median": v[0], "times": v[1]} for k, v in results.items()},
        },
    )


if __name__ == "__main__":
    main()
