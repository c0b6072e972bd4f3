"""Builders for the executor's scale tests and benchmark: the same token data split into any
number of Parquet sources, planned with equal weights, and replayed in a fresh child process
that reports its memory and open files.

A plain module (tests/conftest.py puts tests/ on sys.path): `from many_sources import ...`;
bench/bench_executor.py puts tests/ on sys.path to import it.

The data is drawn once for `total_rows` rows from `seed` and then cut into `n_sources`
contiguous runs of rows, so the token ids, the lengths and the bytes of payload are the same
whatever the number of sources: only the split changes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mds.planner.index.build import build_index
from mds.planner.index.config import parse_config
from mds.planner.plan.config import plan_config_from_dict

__all__ = [
    "CONFIG_FILE",
    "MIN_LEN",
    "VOCAB",
    "replay_in_child",
    "source_name",
    "token_config",
    "token_lengths",
    "token_plan",
    "token_sources",
]

VOCAB = 50_000
MIN_LEN = 8
CONFIG_FILE = "sources.json"  # the config dict of the sources, next to the data


def source_name(i: int) -> str:
    return f"s{i:05d}"


def token_lengths(rng: np.random.Generator, rows: int, mean_len: int) -> np.ndarray:
    """Uniform lengths in [MIN_LEN, 2 * mean_len - MIN_LEN]: mean `mean_len`, bounded."""
    if mean_len < MIN_LEN:
        raise ValueError(f"mean_len must be >= {MIN_LEN}, got {mean_len}")
    return rng.integers(MIN_LEN, 2 * mean_len - MIN_LEN + 1, rows, dtype=np.int64)


def _split(total: int, parts: int) -> np.ndarray:
    """Boundaries of `parts` contiguous runs of [0, total) whose sizes differ by at most 1."""
    sizes = np.full(parts, total // parts, dtype=np.int64)
    sizes[: total % parts] += 1
    bounds = np.zeros(parts + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    return bounds


def token_sources(
    root: Path,
    n_sources: int,
    total_rows: int,
    *,
    seed: int,
    mean_len: int = 64,
    files_per_source: int = 1,
    row_group_size: int | None = None,
) -> Path:
    """Write `n_sources` Parquet sources under `root` (`tokens`: list<int32>, together
    `total_rows` rows whatever `n_sources` is), index them into root/index and return it.

    Every source has `files_per_source` files (as equal as possible; every file has at least
    one row) and weight 1. The config dict is saved as root/sources.json (`token_config`).
    `row_group_size` is pyarrow's (None: its default, one row group for small files).
    """
    root = Path(root)
    if n_sources < 1 or files_per_source < 1:
        raise ValueError("n_sources and files_per_source must be >= 1")
    if total_rows < n_sources * files_per_source:
        raise ValueError(
            f"{total_rows} rows cannot give {n_sources} sources x {files_per_source} files a row each"
        )
    rng = np.random.default_rng([seed, mean_len, total_rows])
    lengths = token_lengths(rng, total_rows, mean_len)
    offsets = np.zeros(total_rows + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = rng.integers(0, VOCAB, int(offsets[-1]), dtype=np.int32)

    bounds = _split(total_rows, n_sources * files_per_source)
    tables = []
    for s in range(n_sources):
        name = source_name(s)
        directory = root / name
        directory.mkdir(parents=True, exist_ok=True)
        for f in range(files_per_source):
            k = s * files_per_source + f
            a, b = int(bounds[k]), int(bounds[k + 1])
            local = (offsets[a : b + 1] - offsets[a]).astype(np.int32)
            column = pa.ListArray.from_arrays(
                pa.array(local), pa.array(values[offsets[a] : offsets[b]])
            )
            pq.write_table(
                pa.table({"tokens": column}),
                directory / f"part-{f:04d}.parquet",
                row_group_size=row_group_size,
            )
        tables.append({"name": name, "path": f"{name}/*.parquet", "tokens": "tokens", "weight": 1})
    data: dict[str, Any] = {
        "index": {"output": "index"},
        "source": tables,
        # a placeholder for the index stage; token_plan sets the real [train]
        "train": {
            "steps": 1,
            "dp_size": 1,
            "samples_per_step": 1,
            "max_tokens_per_micro_batch": 2 * mean_len,
        },
    }
    (root / CONFIG_FILE).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    index = root / "index"
    build_index(parse_config(data, path=root / "config.toml"), index, workers=1)
    return index


def token_config(root: Path) -> dict[str, Any]:
    """The config dict `token_sources` wrote for the sources under `root`."""
    return json.loads((Path(root) / CONFIG_FILE).read_text(encoding="utf-8"))


def token_plan(
    root: Path,
    index: Path,
    steps: int,
    samples_per_step: int,
    dp_size: int = 1,
    micro_batches: int = 4,
    max_tokens: int | None = None,
    *,
    out: Path | None = None,
    seed: int = 7,
    chunk_steps: int | None = None,
) -> Path:
    """Plan the sources under `root` (index `index`) with equal weights; returns the plan
    (default root/plan.mds). `max_tokens` per micro-batch defaults to room for every sample
    of a rank's step in any one micro-batch, so packing never fails."""
    from mds.planner.plan.build import build_plan

    root = Path(root)
    data = token_config(root)
    if max_tokens is None:
        max_tokens = _longest(index) * -(-samples_per_step // dp_size)
    data["train"] = {
        "steps": steps,
        "dp_size": dp_size,
        "micro_batches": micro_batches,
        "samples_per_step": samples_per_step,
        "max_tokens_per_micro_batch": max_tokens,
        "seed": seed,
    }
    data["plan"] = {"index": str(Path(index).resolve())}
    if chunk_steps is not None:
        data["plan"]["chunk_steps"] = chunk_steps
    config = plan_config_from_dict(data, base=root)
    out = Path(out) if out is not None else root / "plan.mds"
    build_plan(config, out, workers=1)
    return out


def _longest(index: Path) -> int:
    """The longest sample of `index` (its manifest's length stats)."""
    manifest = json.loads((Path(index) / "manifest.json").read_text(encoding="utf-8"))
    return max(int(s["length_stats"]["max"]) for s in manifest["sources"])


# --- replay in a fresh process ----------------------------------------------------------

_CHILD = r"""
import json, os, resource, sys, time

def status(key):
    for line in open("/proc/self/status", encoding="ascii"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return -1

def fds():
    return len(os.listdir("/proc/self/fd"))

args = json.loads(sys.argv[1])
import torch, mds.executor
from mds.executor import PlanExecutor
after_import = {"rss": status("VmRSS"), "hwm": status("VmHWM"), "fds": fds()}
started = time.perf_counter()
budget = {"memory_bytes": args["memory_bytes"]} if args["memory_bytes"] is not None else {}
ex = PlanExecutor(args["plan"], 0, verify=args["verify"], cache_bytes=args["cache_bytes"],
                  max_open_files=args["max_open_files"], **budget)
seen = set()
batches = samples = tokens = 0
max_fds = fds()
for mb in ex:
    seen.update(mb["source"].tolist())
    batches += 1
    samples += len(mb["sample_id"])
    tokens += int(mb["input_ids"].numel())
    if batches % args["fd_every"] == 0:
        max_fds = max(max_fds, fds())
seconds = time.perf_counter() - started
end_fds = fds()
print(json.dumps({
    "after_import_rss": after_import["rss"],
    "after_import_hwm": after_import["hwm"],
    "after_import_fds": after_import["fds"],
    "peak_rss": status("VmHWM"),
    "end_rss": status("VmRSS"),
    "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "end_fds": end_fds,
    "max_fds": max(max_fds, end_fds),
    "open_readers": len(ex._catalog.files),
    "sources_touched": len(seen),
    "micro_batches": batches,
    "samples": samples,
    "tokens": tokens,
    "seconds": seconds,
}))
"""


def replay_in_child(
    plan: Path,
    *,
    max_open_files: int = 64,
    cache_bytes: int | None = 256 << 20,
    memory_bytes: int | None = None,
    verify: str = "stat",
    fd_every: int = 1,
    timeout: float = 600,
) -> dict[str, Any]:
    """Replay all of rank 0's micro-batches of `plan` in a fresh interpreter and return what
    it measured about itself (bytes and counts); `memory_bytes` (None: not passed) and
    `cache_bytes` are the executor's:

    - `after_import_rss`: VmRSS after `import torch, mds.executor`, before the executor;
    - `peak_rss`: VmHWM after the replay, the process's peak RSS (not `ru_maxrss`, which on
      Linux starts from the parent's RSS when the child was forked or vforked);
    - `max_fds` / `end_fds`: entries of /proc/self/fd, the most seen every `fd_every`
      micro-batches during the replay and at its end; `after_import_fds` before it;
    - `sources_touched`: distinct sources of the samples the replay yielded.
    """
    job = {
        "plan": str(plan),
        "max_open_files": max_open_files,
        "cache_bytes": cache_bytes,
        "memory_bytes": memory_bytes,
        "verify": verify,
        "fd_every": fd_every,
    }
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(job)],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"replay of {plan} failed (exit {proc.returncode}):\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
