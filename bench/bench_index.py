"""Benchmark `mds index` (`build_index`) against a plain Polars read of the same columns.

Three synthetic datasets are generated once under `--data` (one folder per `--scale`, reused
while `meta.json` matches the generator parameters), deterministically from a fixed seed:

  parquet-count   ~2 GiB Parquet, 16 files: `text` (heavy-tailed, up to 32k chars) + int64 `n_tokens`
  parquet-tokens  ~2 GiB Parquet, 16 files: `tokens` list<int32>, Zipf ids over a 50k vocabulary
  jsonl           ~512 MiB JSONL, 8 files: {"id", "text", "lang"} lines

Each dataset is indexed with a fresh output directory and read by the baseline query, every
measurement in its own child process (so the child's ru_maxrss is that run's peak RSS): one
warm-up round, then the median of `--repeat` rounds. The page cache is not dropped (that needs
root), so all numbers are warm-cache numbers. Results go to `<out>/index.md` and
`<out>/index.json`. Timings are reported, never asserted.

Usage: python bench/bench_index.py [--scale 0.05] [--repeat 3] [--out build/bench]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from report import write_report  # noqa: E402  (bench/ is on sys.path when run)

from mds.planner.index.build import build_index
from mds.planner.index.config import parse_config

REPO = Path(__file__).resolve().parents[1]
GENERATOR_VERSION = 2
SEED = 20250611
MIB = 1 << 20
MB = 1e6  # throughput and sizes are reported in MB = 10^6 bytes of files on disk
ROW_GROUP = 64 * 1024
CHUNK_ROWS = 64 * 1024  # lengths are drawn in chunks of this many rows until the budget is met
# 52 letters, 10 spaces, '.' and '\n' (written as the JSON escape `\n` in the JSONL set).
ALPHABET = np.frombuffer(
    b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ" + b" " * 10 + b".\n", dtype=np.uint8
)
VOCAB = 50_000
ZIPF_EXPONENT = 1.0
ZIPF_TABLE_BITS = 20  # inverse-CDF table resolution; every id of the vocabulary is reachable
PARQUET_BYTES_PER_TOKEN = 1.95  # measured ~2.0 (16-bit dictionary indices); errs on the big side
JSONL_ROW_OVERHEAD = 40  # bytes of `{"id":...,"text":"","lang":"en"}\n` around the text
LANGS = ("en", "de", "fr", "es")
LANG_P = (0.70, 0.13, 0.10, 0.07)
ID_STRIDE = 10**9  # JSONL ids are file_index * ID_STRIDE + line


@dataclass(frozen=True)
class Lengths:
    """Pareto lengths with minimum `xm` and shape `alpha`, clipped at `cap`."""

    xm: float
    alpha: float
    cap: int


# write(rng, path, budget_bytes, dataset, file_index) writes one file of the dataset.
Writer = Callable[[np.random.Generator, Path, int, "Dataset", int], None]


@dataclass(frozen=True)
class Dataset:
    """One benchmark dataset: how to generate it, index it and judge the result."""

    name: str
    suffix: str
    files: int
    target_bytes: int  # at --scale 1
    lengths: Lengths
    source: dict[str, Any]  # the [[source]] keys besides name and path
    target_mbps: float
    target_label: str
    extra: dict[str, Any]  # more generator parameters, recorded in meta.json
    write: Writer = field(compare=False, repr=False)

    def params(self, scale: float) -> dict[str, Any]:
        return {
            "generator_version": GENERATOR_VERSION,
            "seed": SEED,
            "scale": scale,
            "files": self.files,
            "target_bytes": int(self.target_bytes * scale),
            "lengths": vars(self.lengths),
            "alphabet": ALPHABET.tobytes().decode("ascii"),
            "row_group": ROW_GROUP,
            **self.extra,
        }


# --- generation -------------------------------------------------------------------------


def heavy_tailed(
    rng: np.random.Generator,
    budget: float,
    dist: Lengths,
    cost: Callable[[np.ndarray], np.ndarray] = lambda n: n,
) -> np.ndarray:
    """Draw lengths until their summed `cost` (estimated bytes on disk) reaches `budget`."""
    parts, spent = [], 0.0
    while spent < budget:
        n = np.minimum(dist.xm * (1.0 + rng.pareto(dist.alpha, CHUNK_ROWS)), dist.cap)
        parts.append(n.astype(np.int64))
        spent += float(cost(parts[-1]).sum())
    lengths = np.concatenate(parts)
    cut = int(np.searchsorted(np.cumsum(cost(lengths)), budget)) + 1
    return lengths[:cut]


def offsets_of(lengths: np.ndarray, dtype=np.int64) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=dtype)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def random_text(rng: np.random.Generator, lengths: np.ndarray) -> pa.Array:
    """A string array of random characters from ALPHABET, built from raw buffers."""
    large = int(lengths.sum()) >= 2**31  # int32 offsets up to 2 GiB of text per file
    offsets = offsets_of(lengths, np.int64 if large else np.int32)
    raw = np.frombuffer(rng.bytes(int(offsets[-1])), dtype=np.uint8)
    chars = ALPHABET[raw & (len(ALPHABET) - 1)]
    kind = pa.LargeStringArray if large else pa.StringArray
    return kind.from_buffers(len(lengths), pa.py_buffer(offsets), pa.py_buffer(chars))


@cache
def zipf_table() -> np.ndarray:
    """Inverse CDF of a Zipf law over VOCAB ranks, mapped to shuffled token ids."""
    ranks = np.arange(1, VOCAB + 1, dtype=np.float64)
    cdf = np.cumsum(ranks**-ZIPF_EXPONENT)
    cdf /= cdf[-1]
    size = 1 << ZIPF_TABLE_BITS
    rank = np.searchsorted(cdf, (np.arange(size) + 0.5) / size)
    ids = np.random.default_rng(SEED).permutation(VOCAB).astype(np.int32)
    return ids[np.minimum(rank, VOCAB - 1)]


def write_count_file(
    rng: np.random.Generator, path: Path, budget: int, ds: Dataset, _index: int
) -> None:
    lengths = heavy_tailed(rng, budget, ds.lengths)
    table = pa.table(
        {"text": random_text(rng, lengths), "n_tokens": pa.array((lengths + 3) // 4, pa.int64())}
    )
    pq.write_table(table, path, row_group_size=ROW_GROUP)


def write_tokens_file(
    rng: np.random.Generator, path: Path, budget: int, ds: Dataset, _index: int
) -> None:
    lengths = heavy_tailed(rng, budget, ds.lengths, lambda n: n * PARQUET_BYTES_PER_TOKEN)
    offsets = offsets_of(lengths, np.int32)
    draws = rng.integers(0, 1 << ZIPF_TABLE_BITS, int(offsets[-1]), dtype=np.uint32)
    tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(zipf_table()[draws]))
    pq.write_table(pa.table({"tokens": tokens}), path, row_group_size=ROW_GROUP)


def jsonl_line_bytes(n: np.ndarray) -> np.ndarray:
    """Estimated bytes of a JSONL line whose text has `n` characters ('\n' doubles)."""
    return n * (1 + 1 / len(ALPHABET)) + JSONL_ROW_OVERHEAD


def write_jsonl_file(
    rng: np.random.Generator, path: Path, budget: int, ds: Dataset, index: int
) -> None:
    lengths = heavy_tailed(rng, budget, ds.lengths, jsonl_line_bytes)
    codes = rng.choice(len(LANGS), size=len(lengths), p=LANG_P)
    frame = pl.DataFrame(
        {
            "id": np.arange(len(lengths), dtype=np.int64) + index * ID_STRIDE,
            "text": pl.from_arrow(random_text(rng, lengths)),
            "lang": pl.Series(LANGS).gather(codes),
        }
    )
    frame.write_ndjson(path)


DATASETS = (
    Dataset(
        "parquet-count",
        ".parquet",
        16,
        2048 * MIB,
        Lengths(400, 1.2, 32768),
        {"format": "parquet", "count": "n_tokens", "text": "text"},
        1000,
        "Parquet with a count column",
        {"n_tokens": "ceil(chars/4)"},
        write_count_file,
    ),
    Dataset(
        "parquet-tokens",
        ".parquet",
        16,
        2048 * MIB,
        Lengths(150, 1.8, 8192),
        {"format": "parquet", "tokens": "tokens"},
        1000,
        "Parquet with list offsets",
        {
            "vocab": VOCAB,
            "zipf_exponent": ZIPF_EXPONENT,
            "bytes_per_token": PARQUET_BYTES_PER_TOKEN,
        },
        write_tokens_file,
    ),
    Dataset(
        "jsonl",
        ".jsonl",
        8,
        512 * MIB,
        Lengths(200, 1.3, 32768),
        {"format": "jsonl", "text": "text", "estimate": "bytes/4", "keep": ["lang"]},
        200,
        "JSONL with the bytes estimate",
        {"langs": list(LANGS), "lang_p": list(LANG_P)},
        write_jsonl_file,
    ),
)
BY_NAME = {d.name: d for d in DATASETS}


def write_file(ds: Dataset, directory: Path, index: int, budget: int) -> tuple[str, int]:
    """Write file `index` of `ds`; its own seed makes it independent of thread scheduling."""
    rng = np.random.default_rng([SEED, zlib.crc32(ds.name.encode()), index])
    path = directory / f"part-{index:05d}{ds.suffix}"
    ds.write(rng, path, budget, ds, index)
    return path.name, path.stat().st_size


def read_meta(root: Path) -> dict[str, Any]:
    try:
        return json.loads((root / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def is_cached(ds: Dataset, root: Path, scale: float) -> bool:
    entry = read_meta(root).get(ds.name)
    if not entry or entry.get("params") != ds.params(scale):
        return False
    directory = root / ds.name
    return all(
        (directory / name).is_file() and (directory / name).stat().st_size == size
        for name, size in entry["files"].items()
    )


def generate(ds: Dataset, root: Path, scale: float, workers: int) -> float:
    """Generate `ds` under `root` unless cached; return the seconds spent (0 if cached)."""
    if is_cached(ds, root, scale):
        return 0.0
    started = time.perf_counter()
    final, partial = root / ds.name, root / f"{ds.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    budget = max(1, int(ds.target_bytes * scale) // ds.files)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        files = dict(pool.map(lambda i: write_file(ds, partial, i, budget), range(ds.files)))
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    meta = read_meta(root)
    meta[ds.name] = {"params": ds.params(scale), "files": files}
    (root / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return time.perf_counter() - started


def data_files(ds: Dataset, root: Path) -> list[Path]:
    return sorted((root / ds.name).glob(f"*{ds.suffix}"))


# --- one measurement, run in a child process --------------------------------------------


def ru_maxrss_mb() -> float:
    """getrusage's peak RSS of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB


def peak_rss_mb() -> float:
    """Peak RSS of this process image: VmHWM, else ru_maxrss.

    On Linux a child's ru_maxrss starts at the parent's RSS when it forked (the kernel keeps
    the forked copy's high-water mark across exec), so it can report the benchmark driver's
    memory rather than the build's; VmHWM belongs to the exec'ed image alone.
    """
    try:
        status = Path("/proc/self/status").read_text(encoding="ascii")
    except OSError:
        return ru_maxrss_mb()
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / MB
    return ru_maxrss_mb()


def fast_path_status() -> str:
    """Whether parquet.py's `list_lengths` fast path (parquet_levels) can be imported."""
    try:
        module = importlib.import_module("mds.formats.parquet.levels")
    except ImportError as exc:
        return f"inactive (not importable: {exc})"
    except Exception as exc:  # a half-written module: parquet.py would fail on it too
        return f"broken ({type(exc).__name__}: {exc})"
    return "active" if hasattr(module, "list_lengths") else "inactive (no list_lengths)"


def baseline_query(ds: Dataset, files: list[str]) -> pl.LazyFrame:
    """Plain Polars read of the column(s) our scanner needs for the lengths."""
    if ds.name == "parquet-count":
        return pl.scan_parquet(files).select("n_tokens")
    if ds.name == "parquet-tokens":
        return pl.scan_parquet(files).select(pl.col("tokens").list.len())
    return pl.scan_ndjson(files).select(pl.col("text").str.len_bytes())


def run_ours(ds: Dataset, root: Path, index: Path, workers: int) -> int:
    config = parse_config(
        {"index": {"root": str(root)}, "source": [{"name": ds.name, "path": ds.name, **ds.source}]},
        base=root,
    )
    summary = build_index(config, index, workers=workers)
    return summary.sources[0].rows


def child_main(job: dict[str, Any]) -> None:
    """Entry point of a measurement child: run one job, print one JSON line."""
    ds, root = BY_NAME[job["dataset"]], Path(job["root"])
    start_rss = peak_rss_mb()
    started = time.perf_counter()
    if job["kind"] == "ours":
        rows = run_ours(ds, root, Path(job["index"]), job["workers"])
    else:
        rows = baseline_query(ds, [str(p) for p in data_files(ds, root)]).collect().height
    seconds = time.perf_counter() - started
    result = {"seconds": seconds, "rows": rows, "peak_rss_mb": peak_rss_mb()}
    result["start_rss_mb"] = start_rss
    result["ru_maxrss_mb"] = ru_maxrss_mb()
    if job["kind"] == "ours" and "tokens" in ds.source:
        result["fast_path"] = fast_path_status()
    print(json.dumps(result))


def run_child(job: dict[str, Any]) -> dict[str, Any]:
    """Run one job in a fresh interpreter (its own ru_maxrss) and return its result."""
    if job["kind"] == "ours":
        shutil.rmtree(job["index"], ignore_errors=True)  # nothing may be reused
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(job)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if job["kind"] == "ours":
        shutil.rmtree(job["index"], ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"{job['kind']} run on {job['dataset']} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- the benchmark ----------------------------------------------------------------------


def measure(ds: Dataset, root: Path, work: Path, repeat: int, workers: int) -> dict[str, Any]:
    """One warm-up round, then `repeat` rounds of ours and baseline side by side."""
    files = data_files(ds, root)
    size = sum(p.stat().st_size for p in files)
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "baseline": []}
    for round_ in range(repeat + 1):
        for kind in runs:
            job = {"kind": kind, "dataset": ds.name, "root": str(root), "workers": workers}
            job["index"] = str(work / f"{ds.name}-index")
            result = run_child(job)
            if round_ > 0:
                runs[kind].append(result)
            print(
                f"  {ds.name} {kind:8s} {'warm-up' if round_ == 0 else f'run {round_}':8s} "
                f"{result['seconds']:8.3f} s  peak RSS {result['peak_rss_mb']:7.1f} MB",
                flush=True,
            )
    rows = {r["rows"] for rs in runs.values() for r in rs}
    if len(rows) != 1:
        raise SystemExit(f"{ds.name}: ours and baseline disagree on the row count: {rows}")
    return summarise(ds, files, size, rows.pop(), runs)


def summarise(
    ds: Dataset, files: list[Path], size: int, rows: int, runs: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    ours_s = statistics.median(r["seconds"] for r in runs["ours"])
    base_s = statistics.median(r["seconds"] for r in runs["baseline"])
    ours_mbps = size / MB / ours_s
    row = {
        "dataset": ds.name,
        "files": len(files),
        "size_mb": size / MB,
        "rows": rows,
        "ours_s": ours_s,
        "ours_mbps": ours_mbps,
        "ours_rows_per_s": rows / ours_s,
        "baseline_s": base_s,
        "baseline_mbps": size / MB / base_s,
        "ours_over_baseline": base_s / ours_s,  # throughput ratio: > 1 means ours is faster
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs["ours"]),
        "start_rss_mb": max(r["start_rss_mb"] for r in runs["ours"]),
        "baseline_peak_rss_mb": max(r["peak_rss_mb"] for r in runs["baseline"]),
        "target_mbps": ds.target_mbps,
        "target": ds.target_label,
        "status": "PASS" if ours_mbps >= ds.target_mbps else "MISS",
        "config": ds.source,
        "runs": runs,
    }
    fast = {r["fast_path"] for r in runs["ours"] if "fast_path" in r}
    if fast:
        row["fast_path"] = " / ".join(sorted(fast))
    return row


TABLE_HEADER = (
    "dataset",
    "files",
    "size MB",
    "rows",
    "ours s",
    "ours MB/s",
    "ours rows/s",
    "baseline MB/s",
    "ours/baseline",
    "peak RSS MB",
    "target MB/s",
    "result",
)


def table_row(r: dict[str, Any]) -> list[str]:
    return [
        r["dataset"],
        str(r["files"]),
        f"{r['size_mb']:,.0f}",
        f"{r['rows']:,}",
        f"{r['ours_s']:.3f}",
        f"{r['ours_mbps']:,.0f}",
        f"{r['ours_rows_per_s']:,.0f}",
        f"{r['baseline_mbps']:,.0f}",
        f"{r['ours_over_baseline']:.2f}x",
        f"{r['peak_rss_mb']:,.0f}",
        f">= {r['target_mbps']:,.0f}",
        r["status"],
    ]


def span(values: Iterable[float]) -> str:
    """'a-b' (or just 'a' when they round the same) for the smallest and largest value."""
    low, high = (f"{v:,.0f}" for v in minmax(values))
    return low if low == high else f"{low}-{high}"


def minmax(values: Iterable[float]) -> tuple[float, float]:
    items = list(values)
    return min(items), max(items)


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # not available on this platform
        return None


def markdown(results: list[dict[str, Any]], info: dict[str, Any]) -> str:
    lines = [
        f"# mds index benchmark (scale {info['scale']:g})",
        "",
        "| " + " | ".join(TABLE_HEADER) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(TABLE_HEADER))) + "|",
        *("| " + " | ".join(table_row(r)) + " |" for r in results),
        "",
        "Targets: >= 1000 MB/s for Parquet with a count column or list offsets, >= 200 MB/s "
        "for JSONL with the bytes estimate; `result` compares `ours MB/s` with the row's target.",
        "",
        f"- Median of {info['repeat']} runs after one warm-up, workers={info['workers']}, "
        f"{info['cpus']} CPUs; page cache warm (not dropped: that needs root).",
        "- Load average (1 min) before / after: "
        + " / ".join("n/a" if v is None else f"{v:g}" for v in info["load_average"])
        + ".",
        "- MB = 10^6 bytes of the source files on disk; `ours/baseline` is the throughput "
        "ratio (> 1: ours is faster).",
        '- Baselines: `pl.scan_parquet(files).select("n_tokens")`, '
        '`.select(pl.col("tokens").list.len())`, `pl.scan_ndjson(files)'
        '.select(pl.col("text").str.len_bytes())` (no byte offsets).',
        "- Peak RSS: high-water RSS (VmHWM) of the child process running one build, "
        f"{span(r['start_rss_mb'] for r in results)} MB of it is the interpreter and "
        "libraries before the build starts.",
    ]
    lines += [
        f"- `parquet_levels.list_lengths` fast path ({r['dataset']}): {r['fast_path']}"
        for r in results
        if "fast_path" in r
    ]
    lines.append(f"- {info['platform']}; polars {info['polars']}, pyarrow {info['pyarrow']}.")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark mds index on generated Parquet and JSONL datasets.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=REPO / "build/bench", help="results directory")
    parser.add_argument(
        "--data", type=Path, default=REPO / "build/bench-data", help="generated-data cache"
    )
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the full sizes")
    parser.add_argument("--repeat", type=int, default=3, help="measured runs after one warm-up")
    parser.add_argument("--workers", type=int, default=2, help="build_index workers")
    parser.add_argument(
        "--datasets",
        nargs="+",
        choices=list(BY_NAME),
        default=list(BY_NAME),
        help="datasets to run",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is None and (args.scale <= 0 or args.repeat < 1 or args.workers < 1):
        parser.error("--scale must be > 0, --repeat and --workers >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child is not None:
        child_main(json.loads(args.child))
        return
    root = (args.data / f"scale-{args.scale:g}").resolve()
    out = args.out.resolve()
    work = out / "work"
    root.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    results = []
    load_before = load_average()
    for ds in (BY_NAME[n] for n in args.datasets):
        seconds = generate(ds, root, args.scale, args.workers)
        print(f"{ds.name}: " + (f"generated in {seconds:.1f} s" if seconds else "cached data"))
        results.append(measure(ds, root, work, args.repeat, args.workers))
        results[-1]["generate_s"] = seconds
    shutil.rmtree(work, ignore_errors=True)
    info = {
        "scale": args.scale,
        "repeat": args.repeat,
        "workers": args.workers,
        "cpus": os.cpu_count(),
        "platform": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
        "polars": pl.__version__,
        "pyarrow": pa.__version__,
        "numpy": np.__version__,
        "data": str(root),
        # 1-minute load average before and after: other work on the machine slows both
        # columns, and a serial step of ours more than a query that spreads over the cores.
        "load_average": [load_before, load_average()],
    }
    table = markdown(results, info)
    write_report(out, "index", table, {**info, "results": results})


if __name__ == "__main__":
    main()
