"""Benchmark re-running `mds index` on a corpus of many tiny files after a 1% change,
against a full index of the same files, side by side in one run.

A corpus of `--files` tiny JSONL files (4 lines of 64 token ids each, 1000 per directory)
is generated once under `--data` (reused while its meta.json matches). From the index of
the corpus as it is, each scenario changes 1% of the files, re-indexes into a copy of that
index, and undoes the change (the base index is then brought back in step, untimed):

  unchanged   nothing changed: the cost of proving it
  added       1% new files
  changed     1% of the files rewritten
  removed     1% of the files gone

Each scenario's wall and CPU time is divided by those of a full index (fresh output) of
the same corpus measured in the same round; medians over `--repeat` rounds of the times
and of the ratios. Locally, `listing` is the floor any re-index pays in Python: a walk
of the corpus with os.scandir and one stat per file (sizes and mtimes, no mds code). The same runs on moto's
S3 server (data root and index both under s3:// prefixes; the server in a process of its
own, so the CPU times are mds's) at `--s3-files` files. Results go
to `<out>/reindex.md` and `<out>/reindex.json`; timings are reported, never asserted.

Usage: python bench/bench_reindex.py [--files 100000] [--s3-files 10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from report import write_report  # noqa: E402  (bench/ is on sys.path when run)

from mds.planner.index.build import build_index
from mds.planner.index.config import parse_config

REPO = Path(__file__).resolve().parents[1]
GENERATOR_VERSION = 1
SEED = 20261206
PER_DIR = 1000
LINES, IDS = 4, 64
SCENARIOS = ("unchanged", "added", "changed", "removed")
WORKERS = 2


def body(i: int, salt: int = 0) -> bytes:
    rng = np.random.default_rng([SEED, i, salt])
    ids = rng.integers(0, 50_000, size=(LINES, IDS))
    return "".join(json.dumps({"tokens": row.tolist()}) + "\n" for row in ids).encode()


def rel(i: int) -> str:
    return f"d{i // PER_DIR:04d}/f{i:07d}.jsonl"


def corpus(data: Path, files: int) -> Path:
    """The generated corpus (made once; reused while meta.json matches)."""
    root = data / f"files-{files}"
    meta = {"generator": GENERATOR_VERSION, "files": files, "lines": LINES, "ids": IDS}
    if (root / "meta.json").is_file() and json.loads((root / "meta.json").read_text()) == meta:
        return root
    shutil.rmtree(root, ignore_errors=True)
    for i in range(files):
        path = root / "corpus" / rel(i)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body(i))
    (root / "meta.json").write_text(json.dumps(meta))
    return root


def config(root: str, base: Path):
    data = {"index": {"root": root}, "source": [{"name": "c", "path": "**/*.jsonl", "tokens": "tokens"}]}
    return parse_config(data, path=base / "mds.toml")


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, float]:
    """(wall s, CPU s of this process: every thread, and moto's server when it runs here)."""
    t, c = time.perf_counter(), time.process_time()
    fn(*args, **kwargs)
    return time.perf_counter() - t, time.process_time() - c


class LocalCorpus:
    """Changes to a corpus in a directory, each undone after its run."""

    def __init__(self, root: Path, files: int):
        self.root, self.files = root, files
        self.step = max(2, files // 100)  # 1%: every step-th file

    def picked(self, round_: int) -> list[int]:
        return list(range(round_ % self.step, self.files, self.step))

    def change(self, kind: str, round_: int) -> Callable[[], None]:
        picked = self.picked(round_)
        if kind == "added":
            paths = [self.root / f"d{i // PER_DIR:04d}/new{i:07d}.jsonl" for i in picked]
            for i, p in zip(picked, paths, strict=True):
                p.write_bytes(body(i, 1))
            return lambda: [p.unlink() for p in paths] and None
        if kind == "changed":
            for i in picked:
                (self.root / rel(i)).write_bytes(body(i, 2))
            return lambda: [(self.root / rel(i)).write_bytes(body(i)) for i in picked] and None
        if kind == "removed":  # hidden names are never data; the rename keeps the mtime
            moves = [(self.root / rel(i), self.root / f"{rel(i)[:5]}/.away{i}") for i in picked]
            for a, b in moves:
                a.rename(b)
            return lambda: [b.rename(a) for a, b in moves] and None
        return lambda: None


def listing(root: Path) -> list[tuple[str, int, int]]:
    """Every file's path, size and mtime: os.scandir and one stat per file."""
    out, stack = [], [str(root)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                else:
                    st = e.stat(follow_symlinks=False)
                    out.append((e.path, st.st_size, st.st_mtime_ns))
    return out


def run_local(data: Path, files: int, repeat: int, work: Path) -> dict[str, Any]:
    root = corpus(data, files)
    cfg = config(str(root / "corpus"), root)
    changes = LocalCorpus(root / "corpus", files)
    base = work / "base"
    shutil.rmtree(work, ignore_errors=True)
    build_index(cfg, base, workers=WORKERS)  # warm-up, and the index every scenario starts from
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in ("full", *SCENARIOS, "listing")}
    for r in range(repeat):
        fresh = work / f"full-{r}"
        runs["full"].append(timed(build_index, cfg, fresh, workers=WORKERS))
        shutil.rmtree(fresh)
        runs["listing"].append(timed(listing, root / "corpus"))
        for kind in SCENARIOS:
            out = work / f"{kind}-{r}"
            shutil.copytree(base, out)
            undo = changes.change(kind, r)
            runs[kind].append(timed(build_index, cfg, out, workers=WORKERS))
            undo()
            shutil.rmtree(out)
            build_index(cfg, base, workers=WORKERS)  # back in step with the data, untimed
    return runs


def run_s3(data: Path, files: int, repeat: int) -> dict[str, Any]:
    import boto3
    import moto.server  # noqa: F401  (the server below is this module, in a process of its own)

    # A process of its own: pyarrow's S3 client would wait on a server thread here for the GIL.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        host, port = probe.getsockname()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            socket.create_connection((host, port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true", AWS_ENDPOINT_URL=f"http://{host}:{port}",
    )
    client = boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1")
    client.create_bucket(Bucket="bench")
    try:
        for i in range(files):
            client.put_object(Bucket="bench", Key=f"corpus/{rel(i)}", Body=body(i))
        root = corpus(data, files)  # only for its directory: the config's place
        cfg = config("s3://bench/corpus", root)
        step = max(2, files // 100)

        def copy_prefix(src: str, dst: str) -> None:
            for page in client.get_paginator("list_objects_v2").paginate(Bucket="bench", Prefix=f"{src}/"):
                for o in page.get("Contents", []):
                    key = dst + o["Key"][len(src) :]
                    client.copy_object(Bucket="bench", Key=key, CopySource={"Bucket": "bench", "Key": o["Key"]})

        def drop_prefix(prefix: str) -> None:
            """Remove a measured index: moto lists by scanning every key of the bucket."""
            for page in client.get_paginator("list_objects_v2").paginate(Bucket="bench", Prefix=f"{prefix}/"):
                for o in page.get("Contents", []):
                    client.delete_object(Bucket="bench", Key=o["Key"])

        def change(kind: str, r: int) -> Callable[[], None]:
            picked = list(range(r % step, files, step))
            if kind == "added":
                keys = [f"corpus/d{i // PER_DIR:04d}/new{i:07d}.jsonl" for i in picked]
                for i, k in zip(picked, keys, strict=True):
                    client.put_object(Bucket="bench", Key=k, Body=body(i, 1))
                return lambda: [client.delete_object(Bucket="bench", Key=k) for k in keys] and None
            if kind in ("changed", "removed"):
                for i in picked:
                    key = f"corpus/{rel(i)}"
                    if kind == "changed":
                        client.put_object(Bucket="bench", Key=key, Body=body(i, 2))
                    else:
                        client.delete_object(Bucket="bench", Key=key)
                return lambda: [
                    client.put_object(Bucket="bench", Key=f"corpus/{rel(i)}", Body=body(i)) for i in picked
                ] and None
            return lambda: None

        build_index(cfg, "s3://bench/base", workers=WORKERS)
        runs: dict[str, list[tuple[float, float]]] = {k: [] for k in ("full", *SCENARIOS)}
        for r in range(repeat):
            runs["full"].append(timed(build_index, cfg, f"s3://bench/full-{r}", workers=WORKERS))
            drop_prefix(f"full-{r}")
            for kind in SCENARIOS:
                copy_prefix("base", f"{kind}-{r}")
                undo = change(kind, r)
                runs[kind].append(timed(build_index, cfg, f"s3://bench/{kind}-{r}", workers=WORKERS))
                undo()
                drop_prefix(f"{kind}-{r}")
                build_index(cfg, "s3://bench/base", workers=WORKERS)
        return runs
    finally:
        server.terminate()
        server.wait()


def medians(runs: dict[str, list[tuple[float, float]]]) -> dict[str, Any]:
    """Median wall and CPU seconds of each run, and the median over rounds of each
    scenario's time divided by the full index's of the same round (the machine's load
    drifts between rounds, less within one)."""
    out: dict[str, Any] = {}
    for k, v in runs.items():
        out[k] = {"wall": statistics.median(w for w, _ in v), "cpu": statistics.median(c for _, c in v)}
        if k != "full":
            for i, what in enumerate(("wall", "cpu")):
                ratios = [r[i] / f[i] for r, f in zip(v, runs["full"], strict=True)]
                out[k][f"{what}_ratio"] = statistics.median(ratios)
    return out


def table(results: dict[str, dict[str, Any]]) -> str:
    shown = (*SCENARIOS, "listing")
    head = " | ".join(f"{k}: wall s, CPU s (ratios)" for k in shown)
    lines = [
        f"| where | files | full: wall s, CPU s | {head} |",
        "|---|---:|---:|" + "---:|" * len(shown),
    ]
    for where, res in results.items():
        m = res["medians"]
        cells = " | ".join(
            f"{m[k]['wall']:.2f}, {m[k]['cpu']:.2f} ({m[k]['wall_ratio']:.3f}, {m[k]['cpu_ratio']:.3f})"
            if k in m
            else "-"
            for k in shown
        )
        full = m["full"]
        lines.append(f"| {where} | {res['files']} | {full['wall']:.2f}, {full['cpu']:.2f} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=100_000, help="files of the local corpus")
    p.add_argument("--s3-files", type=int, default=10_000, help="files on moto S3 (0: skip)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--data", type=Path, default=REPO / "build/bench-data/reindex")
    p.add_argument("--out", type=Path, default=REPO / "build/bench")
    a = p.parse_args(argv)
    results: dict[str, dict[str, Any]] = {}
    work = a.out / "reindex-work"
    runs = run_local(a.data, a.files, a.repeat, work)
    results["local"] = {"files": a.files, "runs": runs, "medians": medians(runs)}
    shutil.rmtree(work, ignore_errors=True)
    if a.s3_files:
        try:
            runs = run_s3(a.data, a.s3_files, a.repeat)
            results["moto S3"] = {"files": a.s3_files, "runs": runs, "medians": medians(runs)}
        except ImportError:
            print("moto is not installed: the S3 runs are left out", file=sys.stderr)
    data = {"workers": WORKERS, "repeat": a.repeat, "results": results}
    write_report(a.out, "reindex", table(results), data)


if __name__ == "__main__":
    main()
