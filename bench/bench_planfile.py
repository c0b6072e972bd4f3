"""Plan file size and the time to read one rank's block: format 4 against formats 3 and 2,
on the same plans.

Each case is indexed and planned once (kept under build/bench-data/planfile); the plan is
written by `mds plan` in format 4 and copied block by block into formats 3 and 2
(PlanWriter's `version`: format 2, every block with its own fetch columns and file records,
raw sections; format 3, a file table per chunk compressed alone, the footer plain JSON), so
the files hold the very same samples. Reported per case: bytes per planned sample of each
file, and of the parts of formats 3 and 4 (blocks, file tables, sections, footer); then the
time of `PlanReader.rank_chunk(chunk, rank)` with the reader's caches emptied (what the executor
pays when it starts a chunk: directory, file table, block, checksums, decoding; format 4's
first file table, which later ones are compressed against, is read once per reader, and
kept), the formats alternating read by read, over every (chunk, rank), `--repeat` rounds: the median
of each and their ratio; and the time per micro-batch of a rank's whole replay as
PlanExecutor._slice does it (each chunk's block read at its first step, then every
micro-batch's ids and fetch records sliced), rank by rank, alternating.

Cases: synthetic Parquet sources of 200k rows with an `n_tokens` column (1 source in 1 file,
1 source in 100 files, 64 sources in 4 files each), 200 steps of 256 samples, dp_size 8, one
chunk; sample_data/ as configured (`chunk_steps` 16); 1024 Parquet token-list sources of 400
rows (row-group offsets in the plan), 2,000 steps of 64 samples, dp_size 8.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import write_report  # noqa: E402

from mds.core.planfile import ChunkBlocks  # noqa: E402
from mds.core.planfile_reader import PlanReader  # noqa: E402
from mds.core.planfile_writer import PlanWriter  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VERSION = 1  # of the generated data


def _count_sources(root: Path, sources: int, files: int, rows: int) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = []
    for s in range(sources):
        rng = np.random.default_rng([11, s])
        n = np.clip(rng.lognormal(5.5, 0.8, rows), 16, 8192).astype(np.int64)
        for f, part in enumerate(np.array_split(n, files)):
            path = root / f"s{s:04d}" / f"part{f:03d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"n_tokens": part}), path)
        lines.append(
            f'[[source]]\nname = "s{s:04d}"\npath = "s{s:04d}/*.parquet"\n'
            'count = "n_tokens"\nweight = 1.0\n'
        )
    return lines


def _token_sources(root: Path, sources: int, rows: int) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = []
    for s in range(sources):
        rng = np.random.default_rng([7, s])
        lengths = rng.integers(64, 512, rows)
        values = rng.integers(0, 50_000, int(lengths.sum()), dtype=np.int32)
        offsets = np.zeros(rows + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        path = root / f"s{s:04d}.parquet"
        pq.write_table(pa.table({"tokens": tokens}), path)
        lines.append(
            f'[[source]]\nname = "s{s:04d}"\npath = "s{s:04d}.parquet"\n'
            'tokens = "tokens"\nweight = 1.0\n'
        )
    return lines


def _train(steps: int, per_step: int, chunk_steps: int) -> str:
    return (
        f"[plan]\nchunk_steps = {chunk_steps}\n\n[train]\nsteps = {steps}\ndp_size = 8\n"
        f"micro_batches = 1\nsamples_per_step = {per_step}\n"
        "max_tokens_per_micro_batch = 1048576\nseed = 3\n\n"
        "[cost]\nmodel = { layers = 12, hidden = 768, vocab = 50000 }\n"
    )


CASES = {
    "1 source, 1 file": lambda d: (_count_sources(d, 1, 1, 200_000), _train(200, 256, 200)),
    "1 source, 100 files": lambda d: (_count_sources(d, 1, 100, 200_000), _train(200, 256, 200)),
    "64 sources, 4 files each": lambda d: (
        _count_sources(d, 64, 4, 200_000),
        _train(200, 256, 200),
    ),
    "sample_data (chunk_steps 16)": None,
    "1024 sources, 64 samples a step": lambda d: (
        _token_sources(d, 1024, 400),
        _train(2000, 64, 256),
    ),
}


def _mds(*args: str, cwd: Path) -> str:
    mds = str(Path(sys.executable).with_name("mds"))
    out = subprocess.run([mds, *args], cwd=cwd, check=True, capture_output=True, text=True)
    return out.stdout


def make_plan(data: Path, name: str) -> Path:
    """The case's index (kept) and its plan in the current format (made every run)."""
    slug = "".join(c if c.isalnum() else "-" for c in name).strip("-")
    root = data / slug
    if CASES[name] is None:  # sample_data as configured
        if not (root / "index" / "manifest.json").exists():
            root.mkdir(parents=True, exist_ok=True)
            _mds("index", str(ROOT / "sample_data" / "mds.toml"), "-o", str(root / "index"), cwd=root)
        config = ROOT / "sample_data" / "mds.toml"
    else:
        config = root / "mds.toml"
        marker = root / "meta.json"
        if not (marker.exists() and json.loads(marker.read_text()) == VERSION):
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            sources, train = CASES[name](root)
            config.write_text('[index]\noutput = "index"\n\n' + "\n".join(sources) + "\n" + train)
            _mds("index", str(config), "-o", "index", cwd=root)
            marker.write_text(json.dumps(VERSION))
    plan = root / "plan.mds"
    _mds("plan", str(config), "--index", str(root / "index"), "-o", str(plan), cwd=root)
    return plan


def as_version(plan: Path, out: Path, version: int) -> None:
    """The same plan in an older format: every block re-encoded, sections as that format
    stores them, the same footer. Format 2: blocks with their own fixed-width columns and
    file records, raw sections; format 3: per-chunk file tables, the footer plain JSON."""
    with PlanReader(plan) as r:
        footer = json.loads(r.footer_bytes)
        footer.pop("layout")
        writer = PlanWriter(
            out, out.with_suffix(".tmp"), dp_size=r.dp, micro_batches=r.micro,
            id_width=r.id_width, version=version,
        )  # fmt: skip
        for c, (a, b, *_rest) in enumerate(r.chunks):
            blocks = [r.rank_chunk(c, k) for k in range(r.dp)]
            writer.add_chunk(a, b, ChunkBlocks.of([(x.counts, x.ids, x.fetch) for x in blocks]))
        for name in sorted(r.sections):
            sparse = r.sections[name].get("codec") == "sparse"
            writer.add_section(name, np.asarray(r.section(name)), sparse=sparse)
        writer.commit(footer)


def parts(plan: Path) -> dict[str, int]:
    """Bytes of a format-3 or -4 plan's blocks, file tables, sections and footer."""
    with PlanReader(plan) as r:
        blocks = tables = 0
        for c in range(len(r.chunks)):
            directory = r._directory(c)
            blocks += int(directory["size"][: r.dp].sum())
            tables += int(directory["size"][r.dp :].sum())
        sections = sum(int(m["size"]) for m in r.sections.values())
        samples = sum(len(r.rank_chunk(c, k).ids) for c in range(len(r.chunks)) for k in range(r.dp))
        footer = len(r._footer_stored)
    return {
        "blocks": blocks,
        "tables": tables,
        "sections": sections,
        "footer": footer,
        "samples": samples,
    }


def read_times(paths: list[Path], repeat: int) -> list[list[float]]:
    """Seconds of each rank_chunk read, per plan, the plans alternating read by read."""
    readers = [PlanReader(p) for p in paths]
    times: list[list[float]] = [[] for _ in paths]
    try:
        cells = [(c, k) for c in range(len(readers[0].chunks)) for k in range(readers[0].dp)]
        for _ in range(repeat):
            for c, k in cells:
                for reader, out in zip(readers, times, strict=True):
                    reader._dirs.clear()
                    reader._tables.clear()
                    reader._decoded.clear()
                    t = time.perf_counter()
                    reader.rank_chunk(c, k)
                    out.append(time.perf_counter() - t)
    finally:
        for reader in readers:
            reader.close()
    return times


def slice_times(paths: list[Path], repeat: int) -> list[list[float]]:
    """Seconds per (step, micro-batch) of replaying one rank's slice of the whole plan as the
    executor does (PlanExecutor._slice: the chunk's block read on its first step, then each
    micro-batch's ids and fetch records sliced out), from empty caches; the plans alternate
    rank by rank."""
    readers = [PlanReader(p) for p in paths]
    times: list[list[float]] = [[] for _ in paths]
    try:
        first = readers[0]
        cells = (first.steps - first.first_step) * first.micro
        for _ in range(repeat):
            for rank in range(first.dp):
                for reader, out in zip(readers, times, strict=True):
                    reader._dirs.clear()
                    reader._tables.clear()
                    reader._decoded.clear()
                    t = time.perf_counter()
                    held = None
                    for step in range(reader.first_step, reader.steps):
                        chunk = reader.chunk_of(step)
                        if held is None or held[0] != chunk:
                            block = reader.rank_chunk(chunk, rank)
                            starts = np.zeros(block.counts.size + 1, dtype=np.int64)
                            np.cumsum(block.counts.ravel(), out=starts[1:])
                            held = (chunk, block, starts)
                        _, block, starts = held
                        for m in range(reader.micro):
                            k = (step - block.step_start) * reader.micro + m
                            lo, hi = int(starts[k]), int(starts[k + 1])
                            block.ids[lo:hi], [c[lo:hi] for c in block.fetch.columns()]
                    out.append((time.perf_counter() - t) / cells)
    finally:
        for reader in readers:
            reader.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "bench")
    ap.add_argument("--data", type=Path, default=ROOT / "build" / "bench-data" / "planfile")
    ap.add_argument("--repeat", type=int, default=20, help="rounds of reads of every block")
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    args = ap.parse_args()
    results = []
    for name in args.cases:
        plan = make_plan(args.data, name)
        v2, v3 = plan.with_name("plan-v2.mds"), plan.with_name("plan-v3.mds")
        as_version(plan, v2, 2)
        as_version(plan, v3, 3)
        p, p3 = parts(plan), parts(v3)
        n = p["samples"]
        chunks = max(1, len(PlanReader(plan).chunks))
        repeat = max(3, args.repeat * 8 // chunks) if chunks > 8 else args.repeat
        t2, t3, t4 = read_times([v2, v3, plan], repeat)
        s2, s3, s4 = slice_times([v2, v3, plan], max(3, args.repeat // 2))
        results.append(
            {
                "case": name,
                "samples": n,
                "v2_bytes": v2.stat().st_size,
                "v3_bytes": v3.stat().st_size,
                "v4_bytes": plan.stat().st_size,
                **{f"v3_{k}": v for k, v in p3.items() if k != "samples"},
                **{f"v4_{k}": v for k, v in p.items() if k != "samples"},
                "reads": len(t2),
                **{f"v{k}_read_ms": 1000 * statistics.median(t) for k, t in ((2, t2), (3, t3), (4, t4))},
                **{f"v{k}_slice_us": 1e6 * statistics.median(t) for k, t in ((2, s2), (3, s3), (4, s4))},
            }
        )
        print(json.dumps(results[-1]))
    sizes = [
        "| case | samples | format 2 | format 3 | format 4 | blocks (3 / 4) | file tables "
        "(3 / 4) | sections (3 / 4) | footer (3 / 4) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    reads = [
        "| case | block read ms (2) | (3) | (4) | 3/2 | 4/2 | step slice us (2) | (3) | (4) "
        "| 3/2 | 4/2 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        n = r["samples"]

        def pair(part: str, r=r, n=n) -> str:
            return f"{r[f'v3_{part}'] / n:.2f} / {r[f'v4_{part}'] / n:.2f}"

        sizes.append(
            f"| {r['case']} | {n:,} | {r['v2_bytes'] / n:.2f} | {r['v3_bytes'] / n:.2f} "
            f"| {r['v4_bytes'] / n:.2f} | {pair('blocks')} | {pair('tables')} "
            f"| {pair('sections')} | {pair('footer')} |"
        )
        reads.append(
            f"| {r['case']} | {r['v2_read_ms']:.3f} | {r['v3_read_ms']:.3f} "
            f"| {r['v4_read_ms']:.3f} | {r['v3_read_ms'] / r['v2_read_ms']:.2f} "
            f"| {r['v4_read_ms'] / r['v2_read_ms']:.2f} "
            f"| {r['v2_slice_us']:.2f} | {r['v3_slice_us']:.2f} | {r['v4_slice_us']:.2f} "
            f"| {r['v3_slice_us'] / r['v2_slice_us']:.2f} "
            f"| {r['v4_slice_us'] / r['v2_slice_us']:.2f} |"
        )
    table = (
        "Plan bytes per sample in formats 2, 3 and 4 (the same plans), and the parts of "
        "formats 3 and 4 (the rest is the chunk directories):\n\n"
        + "\n".join(sizes)
        + "\n\nThe median time of one rank_chunk read with cold caches, and of one "
        "micro-batch's slice when a rank replays the plan (its blocks read as it goes), the "
        "formats alternated:\n\n"
        + "\n".join(reads)
        + "\n"
    )
    write_report(args.out, "planfile", table, results)


if __name__ == "__main__":
    main()
