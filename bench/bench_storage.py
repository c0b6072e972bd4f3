"""Benchmark where the data lies: per-step fetch time of one plan replayed from local disk
and from an S3-protocol server on 127.0.0.1 (moto's standalone server), with read-ahead
(prefetch of the next step in a background thread) on and off.

Generates, deterministically, Parquet sources of token lists (row groups of 2000 rows) and
a JSONL source of token lists, indexes and plans them once from local disk, uploads the
same files to the server, and replays rank 0 of the same plan (the same plan id) with
`data_root=` the local directory or the s3:// prefix. Per step the loop waits for its
micro-batches (the fetch time the training loop sees), then "trains" for `--compute-ms`
per micro-batch (a sleep), so read-ahead has something to overlap. Each case runs with the
default 256 MiB block cache (which ends up holding the whole small corpus) and with a
small one (`--small-cache-mb`), where most reads miss as they do on a corpus far larger than
the cache; every case starts cold (fresh executor, metadata cache cleared). The table reports the
median per-step wait over the plan's steps, the median of `--repeat` rounds (the cases
take turns within a round), the ratio object store / local disk, and the range requests
and megabytes per step the object store served (whatever the server, the request count
is what a real network's latency multiplies). The local server is
on loopback, so this measures the request path (HTTP, range reads, the block cache), not
a real network's latency. Timings are reported, never asserted.

Usage: python bench/bench_storage.py [--out build/bench] [--repeat 3] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from report import write_report  # noqa: E402  (bench/ is on sys.path when run)

SEED = 20261203
BUCKET = "bench"


def _generate(root: Path, rows: int) -> None:
    rng = np.random.default_rng(SEED)
    for part in range(4):
        lengths = np.clip(rng.pareto(1.8, rows) * 150 + 20, 1, 2000).astype(int)
        tokens = [rng.integers(0, 50_000, n).astype(np.int32) for n in lengths]
        (root / "web").mkdir(parents=True, exist_ok=True)
        import pyarrow as pa

        table = pa.table({"tokens": pa.array(tokens, type=pa.list_(pa.int32()))})
        pq.write_table(table, root / "web" / f"part-{part}.parquet", row_group_size=2000)
    (root / "forum").mkdir(parents=True, exist_ok=True)
    with open(root / "forum" / "forum.jsonl", "w", encoding="utf-8") as f:
        for _ in range(rows):
            n = int(np.clip(rng.pareto(1.5) * 80 + 10, 1, 1500))
            f.write(json.dumps({"ids": rng.integers(0, 50_000, n).tolist()}) + "\n")


def _config(root: str, steps: int) -> dict[str, Any]:
    return {
        "index": {"root": root},
        "source": [
            {"name": "web", "path": "web/*.parquet", "tokens": "tokens", "weight": 0.7},
            {"name": "forum", "path": "forum/forum.jsonl", "tokens": "ids", "weight": 0.3},
        ],
        "train": {
            "steps": steps,
            "dp_size": 2,
            "micro_batches": 4,
            "samples_per_step": 256,
            "max_tokens_per_micro_batch": 65536,
            "seed": 3,
        },
    }


def _serve(monkey_env: dict[str, str]):
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    monkey_env.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        AWS_ENDPOINT_URL=f"http://{host}:{port}",
    )
    os.environ.update(monkey_env)
    return server


def _upload(local: Path, prefix: str) -> str:
    import boto3

    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    client.create_bucket(Bucket=BUCKET)
    for path in sorted(local.rglob("*")):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(local).as_posix()}"
            client.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes())
    return f"s3://{BUCKET}/{prefix}"


def _step_waits(
    plan: Path, root: str, read_ahead: int, cache_mb: int, compute_s: float
) -> tuple[list[float], int, int]:
    """Per step, the seconds the loop waited for its micro-batches (fresh executor, cold
    block cache of `cache_mb`); and the range requests made and bytes they returned."""
    from mds.core import metacache
    from mds.core import object_ranges as ranges
    from mds.executor import PlanExecutor

    metacache.clear()  # every case starts cold: no footer parsed by an earlier one
    requests, nbytes = ranges.counters.requests, ranges.counters.bytes
    waits: list[float] = []
    cache = cache_mb << 20
    with PlanExecutor(plan, 0, data_root=root, read_ahead=read_ahead, cache_bytes=cache) as ex:
        it = iter(ex)
        for _ in range(ex.steps):
            wait = 0.0
            for _m in range(ex.micro_batches):
                t = time.perf_counter()
                next(it)
                wait += time.perf_counter() - t
                time.sleep(compute_s)
            waits.append(wait)
    return waits, ranges.counters.requests - requests, ranges.counters.bytes - nbytes


def _name(case: tuple) -> str:
    where, ahead, cache = case
    return f"{where}/read_ahead={ahead}/cache={cache}MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rows", type=int, default=20_000, help="rows per file")
    parser.add_argument(
        "--small-cache-mb",
        type=int,
        default=4,
        help="a block cache far smaller than the data read: most row groups and blocks miss",
    )
    parser.add_argument("--compute-ms", type=float, default=20.0, help="per micro-batch")
    args = parser.parse_args()
    try:
        import moto.server  # noqa: F401
    except ImportError:
        print("bench_storage: moto[server] is not installed (make setup installs it); skipped")
        return
    from mds.planner.index.build import build_index
    from mds.planner.index.config import parse_config
    from mds.planner.plan.build import build_plan
    from mds.planner.plan.config import plan_config_from_dict

    env: dict[str, str] = {}
    server = _serve(env)
    try:
        with tempfile.TemporaryDirectory(prefix="mds-bench-storage-") as tmp:
            work = Path(tmp)
            local = work / "data"
            _generate(local, args.rows)
            data = _config(str(local), args.steps)
            build_index(parse_config(data, base=work), work / "index", workers=2)
            plan = work / "plan.mds"
            build_plan(
                plan_config_from_dict({**data, "plan": {"index": str(work / "index")}}, base=work),
                plan,
            )
            url = _upload(local, "data")
            cases = [
                (where, ahead, cache)
                for cache in (256, args.small_cache_mb)
                for ahead in (0, 1)
                for where in ("local", "s3")
            ]
            rounds: dict[tuple, list[float]] = {c: [] for c in cases}
            firsts: dict[tuple, list[float]] = {c: [] for c in cases}
            traffic: dict[tuple, tuple[float, float]] = {}
            for _ in range(args.repeat):
                for case in cases:
                    where, ahead, cache = case
                    root = str(local) if where == "local" else url
                    waits, requests, nbytes = _step_waits(
                        plan, root, ahead, cache, args.compute_ms / 1000
                    )
                    rounds[case].append(1000 * statistics.median(waits))
                    firsts[case].append(1000 * waits[0])
                    traffic[case] = (requests / args.steps, nbytes / args.steps / 1e6)
    finally:
        server.stop()
    med = {c: statistics.median(v) for c, v in rounds.items()}
    first = {c: statistics.median(v) for c, v in firsts.items()}
    lines = [
        f"# Per-step fetch time: local disk vs S3 server on 127.0.0.1 (rank 0 of dp 2, "
        f"{args.steps} steps, 4 micro-batches, 128 samples per step, {args.compute_ms:g} ms compute per "
        f"micro-batch; median per-step wait, median of {args.repeat} rounds)",
        "",
        "| block cache | read-ahead | local disk ms/step | s3 ms/step | s3 / local "
        "| first step: local ms | s3 ms | s3 requests/step | s3 MB/step |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cache in (256, args.small_cache_mb):
        for ahead in (0, 1):
            lo, s3 = med[("local", ahead, cache)], med[("s3", ahead, cache)]
            label = "off (read_ahead=0)" if ahead == 0 else "on (read_ahead=1)"
            ratio = f"{s3 / lo:.2f}x" if lo > 0 else "n/a"
            cold = f"{first[('local', ahead, cache)]:.1f} | {first[('s3', ahead, cache)]:.1f}"
            requests, mb = traffic[("s3", ahead, cache)]
            lines.append(
                f"| {cache} MiB | {label} | {lo:.2f} | {s3:.2f} | {ratio} | {cold} "
                f"| {requests:.1f} | {mb:.1f} |"
            )
    table = "\n".join(lines) + "\n"
    write_report(
        args.out,
        "storage",
        table,
        {
            "settings": vars(args) | {"out": str(args.out)},
            "python": platform.python_version(),
            "rounds_ms": {_name(c): v for c, v in rounds.items()},
            "median_ms": {_name(c): v for c, v in med.items()},
            "first_step_ms": {_name(c): v for c, v in first.items()},
            "requests_and_mb_per_step": {_name(c): v for c, v in traffic.items()},
        },
    )


if __name__ == "__main__":
    main()
