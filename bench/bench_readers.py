"""Benchmark random access through `mds.executor.readers`: the latency of fetching one sample.

Generates, into a temporary directory and deterministically from a fixed seed, the same
token lists (~200k rows) as Parquet with 10k-row and with 100k-row row groups, as an Arrow
IPC stream (1000-row batches, as `save_to_disk` writes) and as a Megatron .bin/.idx; and ~50 MB
of JSONL text as plain JSONL, as one zstd frame and as ~1 MiB zstd frames (cut anywhere,
as pzstd cuts). Every case fetches the same random rows one at a time (`fetch([row])`) with a
warm block cache (the rows' blocks decoded beforehand) and a cold one (`LRU(max_bytes=1)`:
every fetch decodes its row group or frame again). Per measurement: the median latency over
up to `--samples` rows, capped at `--budget` seconds; the table reports the median of
`--repeat` rounds, the cases taking turns within each round. The OS page cache stays warm,
so these are CPU costs. Results go to `<out>/readers.md` and `<out>/readers.json`. Timings
are reported, never asserted.

Usage: python bench/bench_readers.py [--out build/bench] [--repeat 3] [--samples 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from report import write_report  # noqa: E402  (bench/ is on sys.path when run)

from mds.core.lru import LRU
from mds.executor.readers import FileReader, open_reader
from mds.formats.megatron import write_dataset

REPO = Path(__file__).resolve().parents[1]
SEED = 20261203
MB = 1e6
MIB = 1 << 20
ROWS = 200_000
VOCAB = 50_000
TEXT_BYTES = 50 * MIB
FRAME_BYTES = 1 * MIB
WARM_CACHE = 1 << 30
WORDS = np.array(
    [
        "".join(chr(97 + c) for c in np.random.default_rng([SEED, i]).integers(0, 26, 2 + i % 8))
        for i in range(4000)
    ]
)


# --- generation -------------------------------------------------------------------------


def token_table(rng: np.random.Generator, rows: int) -> pa.Table:
    """Log-normal lengths (median ~64, capped at 4096), uniform int32 ids."""
    lengths = np.clip(rng.lognormal(4.2, 0.9, rows), 1, 4096).astype(np.int32)
    offsets = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = rng.integers(0, VOCAB, int(offsets[-1]), dtype=np.int32)
    tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    return pa.table({"tokens": tokens})


def jsonl_bytes(rng: np.random.Generator, budget: int) -> bytes:
    """`{"id": i, "text": "..."}` lines of random words until `budget` bytes."""
    lines, size, i = [], 0, 0
    while size < budget:
        n = int(np.clip(rng.lognormal(5.0, 1.0), 5, 8000))
        line = json.dumps({"id": i, "text": " ".join(WORDS[rng.integers(0, len(WORDS), n)])})
        lines.append(line)
        size += len(line) + 1
        i += 1
    return ("\n".join(lines) + "\n").encode()


def zstd_frames(data: bytes, frame: int | None) -> bytes:
    """One frame for all of `data`, or one per `frame` bytes (each with its content size)."""
    cctx = zstandard.ZstdCompressor(level=3)
    if frame is None:
        return cctx.compress(data)
    return b"".join(cctx.compress(data[i : i + frame]) for i in range(0, len(data), frame))


def line_locations(data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(line number, byte offset, byte length) of every line, as the index records them."""
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return np.arange(len(ends), dtype=np.int64), starts.astype(np.int64), ends - starts


@dataclass
class Case:
    """One reader over one generated file, and where its rows lie."""

    name: str
    fmt: str
    path: Path
    kind: str
    column: str
    rows: np.ndarray
    offsets: np.ndarray | None = None
    lengths: np.ndarray | None = None
    companion: Path | None = None
    note: str = ""

    def open(self, blocks: LRU) -> FileReader:
        return open_reader(
            self.fmt,
            self.path,
            payload_kind=self.kind,
            column=self.column,
            companion=self.companion,
            blocks=blocks,
            display=self.path.name,
        )

    def locate(self, picks: np.ndarray) -> tuple:
        if self.offsets is None or self.lengths is None:
            return self.rows[picks], None, None
        return self.rows[picks], self.offsets[picks], self.lengths[picks]


def generate(work: Path, rows: int, text_bytes: int) -> list[Case]:
    rng = np.random.default_rng(SEED)
    table = token_table(rng, rows)
    all_rows = np.arange(rows, dtype=np.int64)
    cases = []
    for group in (10_000, 100_000):
        path = work / f"tokens-rg{group // 1000}k.parquet"
        pq.write_table(table, path, row_group_size=group)
        cases.append(
            Case(
                f"parquet, {group // 1000}k-row groups",
                "parquet",
                path,
                "token_ids",
                "tokens",
                all_rows,
            )
        )
    path = work / "tokens.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=1000):
            writer.write_batch(batch)
    cases.append(
        Case("arrow stream, 1k-row batches", "arrow", path, "token_ids", "tokens", all_rows)
    )
    column = table.column("tokens").combine_chunks()
    offsets, values = column.offsets.to_numpy(), column.values.to_numpy()
    sequences = (values[offsets[i] : offsets[i + 1]] for i in range(rows))
    bin_path, idx_path = write_dataset(work / "tokens", sequences, dtype=np.uint16)
    cases.append(
        Case("megatron", "megatron", bin_path, "token_ids", "", all_rows, companion=idx_path)
    )
    data = jsonl_bytes(rng, text_bytes)
    lines, starts, lengths = line_locations(data)
    (work / "text.jsonl").write_bytes(data)
    cases.append(
        Case("jsonl", "jsonl", work / "text.jsonl", "text", "text", lines, starts, lengths)
    )
    for frame, label in ((None, "1 frame"), (FRAME_BYTES, "1 MiB frames")):
        path = work / f"text-{'one' if frame is None else 'mib'}.jsonl.zst"
        path.write_bytes(zstd_frames(data, frame))
        cases.append(
            Case(f"jsonl.zst, {label}", "jsonl.zst", path, "text", "text", lines, starts, lengths)
        )
    return cases


# --- measurement ------------------------------------------------------------------------


def per_sample(reader: FileReader, case: Case, picks: np.ndarray, budget: float) -> list[float]:
    """Seconds of each single-row fetch, stopping when `budget` seconds are spent (>= 20)."""
    times = []
    deadline = time.perf_counter() + budget
    for pick in picks:
        rows, offsets, lengths = case.locate(np.array([pick]))
        t0 = time.perf_counter()
        reader.fetch(rows, offsets, lengths)
        times.append(time.perf_counter() - t0)
        if len(times) >= 20 and time.perf_counter() > deadline:
            break
    return times


def measure(case: Case, picks: np.ndarray, cache: str, budget: float) -> dict[str, Any]:
    blocks = LRU(max_bytes=WARM_CACHE if cache == "warm" else 1)
    t0 = time.perf_counter()
    reader = case.open(blocks)
    opened = time.perf_counter() - t0
    try:
        if cache == "warm":
            reader.fetch(*case.locate(picks))  # decode every block the timed fetches need
        times = per_sample(reader, case, picks, budget)
    finally:
        reader.close()
    return {"median_s": statistics.median(times), "samples": len(times), "open_s": opened}


def run(cases: list[Case], args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = np.random.default_rng([SEED, 1])
    picks = {c.name: rng.integers(0, len(c.rows), args.samples) for c in cases}
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for round_ in range(args.repeat):
        for case in cases:
            for cache in ("warm", "cold"):
                result = measure(case, picks[case.name], cache, args.budget)
                runs.setdefault((case.name, cache), []).append(result)
                print(
                    f"  round {round_ + 1} {case.name:32s} {cache}: "
                    f"{result['median_s'] * 1e6:10.1f} us over {result['samples']} samples",
                    flush=True,
                )
    results = []
    for case in cases:
        row: dict[str, Any] = {
            "case": case.name,
            "file_mb": case.path.stat().st_size / MB,
            "rows": len(case.rows),
        }
        for cache in ("warm", "cold"):
            rs = runs[(case.name, cache)]
            row[f"{cache}_us"] = statistics.median(r["median_s"] for r in rs) * 1e6
            row[f"{cache}_samples"] = min(r["samples"] for r in rs)
            row[f"{cache}_runs"] = rs
        row["open_ms"] = statistics.median(r["open_s"] for r in runs[(case.name, "cold")]) * 1e3
        results.append(row)
    return results


# --- report -----------------------------------------------------------------------------

TABLE_HEADER = (
    "case",
    "file MB",
    "rows",
    "open ms",
    "warm us/sample",
    "cold us/sample",
    "cold samples",
)


def table_row(r: dict[str, Any]) -> list[str]:
    return [
        r["case"],
        f"{r['file_mb']:,.1f}",
        f"{r['rows']:,}",
        f"{r['open_ms']:,.1f}",
        f"{r['warm_us']:,.1f}",
        f"{r['cold_us']:,.1f}",
        str(r["cold_samples"]),
    ]


def ratios(results: list[dict[str, Any]]) -> dict[str, float]:
    by = {r["case"]: r for r in results}
    one, mib = by["jsonl.zst, 1 frame"], by["jsonl.zst, 1 MiB frames"]
    small, big = by["parquet, 10k-row groups"], by["parquet, 100k-row groups"]
    return {
        "zstd_one_over_mib_cold": one["cold_us"] / mib["cold_us"],
        "zstd_one_over_mib_warm": one["warm_us"] / mib["warm_us"],
        "parquet_100k_over_10k_cold": big["cold_us"] / small["cold_us"],
    }


def markdown(results: list[dict[str, Any]], info: dict[str, Any]) -> str:
    r = info["ratios"]
    lines = [
        "# mds executor readers: random-access latency per sample",
        "",
        "| " + " | ".join(TABLE_HEADER) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(TABLE_HEADER))) + "|",
        *("| " + " | ".join(table_row(x)) + " |" for x in results),
        "",
        f"- zstd, one frame vs 1 MiB frames: {r['zstd_one_over_mib_cold']:,.1f}x the cost per "
        f"sample with a cold cache, {r['zstd_one_over_mib_warm']:.2f}x warm.",
        f"- Parquet, 100k-row vs 10k-row groups, cold: {r['parquet_100k_over_10k_cold']:,.1f}x.",
        f"- Median of {info['repeat']} rounds of the per-sample median over up to "
        f"{info['samples']} random rows (fewer when a measurement reaches {info['budget']:g} s; "
        "`cold samples` is the fewest a round used), one `fetch([row])` per sample.",
        "- warm: `LRU(max_bytes=1 GiB)` holding every block the rows need; cold: "
        "`LRU(max_bytes=1)`, so each fetch decodes its row group or zstd frame again (a frame "
        "too large for the cache is stream-decompressed up to the line). Arrow, Megatron and "
        "plain JSONL have no decoded blocks: warm and cold differ only by noise.",
        "- `open ms`: opening the reader (Parquet footer, Arrow batch list, zstd frame table "
        "from the headers, Megatron index). OS page cache warm (not dropped: that needs root).",
        f"- {info['platform']}, {info['cpus']} CPUs; pyarrow {info['pyarrow']}, "
        f"numpy {info['numpy']}, zstandard {info['zstandard']} (libzstd {info['libzstd']}).",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark random-access payload fetches of the executor's readers.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=REPO / "build/bench", help="results directory")
    parser.add_argument("--repeat", type=int, default=3, help="measured rounds")
    parser.add_argument("--samples", type=int, default=2000, help="random rows per measurement")
    parser.add_argument(
        "--budget", type=float, default=2.0, help="seconds after which a measurement stops"
    )
    parser.add_argument("--rows", type=int, default=ROWS, help="rows of the token-list files")
    parser.add_argument("--text-mb", type=float, default=TEXT_BYTES / MIB, help="MiB of JSONL")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.samples < 1 or args.budget <= 0 or args.rows < 1:
        parser.error("--repeat, --samples and --rows must be >= 1, --budget > 0")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mds-bench-readers-") as tmp:
        started = time.perf_counter()
        cases = generate(Path(tmp), args.rows, int(args.text_mb * MIB))
        print(f"generated {len(cases)} files in {time.perf_counter() - started:.1f} s", flush=True)
        results = run(cases, args)
    info = {
        "repeat": args.repeat,
        "samples": args.samples,
        "budget": args.budget,
        "rows": args.rows,
        "text_mib": args.text_mb,
        "frame_bytes": FRAME_BYTES,
        "cpus": os.cpu_count(),
        "platform": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
        "pyarrow": pa.__version__,
        "numpy": np.__version__,
        "zstandard": zstandard.__version__,
        "libzstd": ".".join(map(str, zstandard.ZSTD_VERSION)),
        "ratios": ratios(results),
    }
    table = markdown(results, info)
    write_report(out, "readers", table, {**info, "results": results})


if __name__ == "__main__":
    main()
