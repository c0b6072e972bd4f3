"""What one rank's executor costs to start, measured in a fresh interpreter: the bytes, files
and memory that `PlanExecutor(plan, rank)` and its first micro-batch take, so a test or a
benchmark can compare corpora of different sizes under the same plan geometry.

A plain module (tests/conftest.py puts tests/ on sys.path): `from slice_probe import ...`;
bench/bench_scale.py puts tests/ on sys.path to import it. `measure_start_up` runs this file
as a script in a child process, which reports one JSON line.

The child first imports torch, numpy, pyarrow, zstandard and every module of mds.executor,
so lazy imports inside the executor do not count as its cost. It then measures from the
executor's construction to its first micro-batch (inclusive):

- `rchar`, `syscr`: bytes and read calls through read syscalls (/proc/self/io), every file
  included (plan, index, data);
- `traced_peak`: peak of Python and numpy allocations (tracemalloc, which numpy reports to);
- `arrow_peak`: growth of pyarrow's default memory pool's peak;
- `rss_peak`: VmHWM above the VmRSS before construction (the peak is reset there when the
  kernel allows it); coarse, it includes allocator and page-cache noise;
- `mapped_rss`: resident bytes of memory maps of files under the watched directories at the
  first micro-batch (a memory-mapped file touched page by page is I/O rchar does not see);
- per watched directory (e.g. "data", "index"): the regular files under it that were opened
  (`open` audit event: builtins.open, io.open, os.open, numpy.memmap), stat'ed (os.stat,
  os.lstat, so also Path.stat/exists/resolve) or named by a directory listing (os.scandir,
  os.listdir, so also glob and os.walk). Reads done in C++ by pyarrow are not seen here but
  are in `rchar`.

The paths are written to a log file as they are seen, not kept in the child, so recording
them does not add to the memory measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["PRELOAD", "measure_start_up", "measure_start_ups", "preload"]

# Modules the executor may import lazily (found with strace on this code): importing them
# first keeps their .pyc reads and code objects out of the measured window.
PRELOAD = (
    "torch",
    "numpy",
    "numpy.ma",
    "pyarrow",
    "pyarrow.compute",
    "pyarrow.dataset",
    "pyarrow.parquet",
    "zstandard",
)


def measure_start_up(
    plan: Path, watch: dict[str, Path], *, dp_rank: int = 0, timeout: float = 600
) -> dict[str, Any]:
    """Run `PlanExecutor(plan, dp_rank)` and its first micro-batch in a fresh interpreter;
    return its measurements (see the module docstring), with `files[name]` the number of
    regular files under `watch[name]` it touched and `touched[name]` a few of them."""
    with tempfile.TemporaryDirectory(prefix="mds-slice-probe-") as tmp:
        log = Path(tmp) / "paths.log"
        job = {
            "plan": str(plan),
            "dp_rank": dp_rank,
            "log": str(log),
            "watch": sorted({str(p) for d in watch.values() for p in (Path(d), Path(d).resolve())}),
        }
        proc = subprocess.run(
            [sys.executable, __file__, json.dumps(job)],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"start-up probe of {plan} failed (exit {proc.returncode}):\n{proc.stderr}"
            )
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        seen = _touched(log.read_text(encoding="utf-8"))
    result["files"], result["touched"] = {}, {}
    for name, directory in watch.items():
        prefixes = tuple(f"{p}{os.sep}" for p in {str(directory), str(Path(directory).resolve())})
        files = sorted(p for p in seen if p.startswith(prefixes))
        result["files"][name] = len(files)
        result["touched"][name] = files[:5]
    return result


def measure_start_ups(
    jobs: list[tuple[Path, dict[str, Path]]], *, workers: int = 2, timeout: float = 600
) -> list[dict[str, Any]]:
    """`measure_start_up(plan, watch)` of each (plan, watch), `workers` children at a time
    (each child measures only itself, so running them side by side changes no number but
    the seconds)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(measure_start_up, p, w, timeout=timeout) for p, w in jobs]
        return [f.result() for f in futures]


def _touched(log: str) -> set[str]:
    """Regular files the child opened or stat'ed, and those in the directories it listed."""
    out: set[str] = set()
    for line in log.splitlines():
        kind, _, path = line.partition("\t")
        if kind == "L":
            try:
                with os.scandir(path) as entries:
                    out.update(e.path for e in entries if e.is_file(follow_symlinks=False))
            except OSError:
                pass
        elif os.path.isfile(path):
            out.add(os.path.normpath(path))
    return out


# --- the child ---------------------------------------------------------------------------


def _io() -> dict[str, int]:
    with open("/proc/self/io", encoding="ascii") as f:
        return {k: int(v) for k, v in (line.split(":") for line in f)}


def _status_bytes(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _mapped_rss(prefixes: tuple[str, ...]) -> int:
    """Resident bytes of the memory maps of files under `prefixes`."""
    total, inside = 0, False
    with open("/proc/self/smaps", encoding="utf-8", errors="replace") as f:
        for line in f:
            head = line.split(maxsplit=5)
            if len(head) >= 5 and "-" in head[0] and ":" in head[3]:  # a mapping's header
                inside = len(head) == 6 and head[5].strip().startswith(prefixes)
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


def preload() -> None:
    """Import PRELOAD and every module of mds.executor but the framework adapters (what the
    probe keeps out of its window)."""
    import importlib
    import pkgutil

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    import mds.executor

    for info in pkgutil.walk_packages(mds.executor.__path__, "mds.executor."):
        if not info.name.startswith("mds.executor.integrations"):  # framework adapters
            importlib.import_module(info.name)


def _child(job: dict[str, Any]) -> dict[str, Any]:
    import gc
    import time
    import tracemalloc

    preload()
    import pyarrow as pa

    from mds.executor import PlanExecutor

    prefixes = tuple(f"{p}{os.sep}" for p in job["watch"])
    cwd = os.getcwd()
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    active = [False]

    def record(kind: str, path: Any) -> None:
        if not active[0] or path is None or isinstance(path, int):
            return
        try:
            text = os.fsdecode(os.fspath(path))
        except TypeError:
            return
        if not text.startswith(os.sep):
            text = os.path.join(cwd, text)
        if text.startswith(prefixes):
            active[0] = False  # os.write raises no audit event, but stay safe
            try:
                os.write(log, f"{kind}\t{text}\n".encode("utf-8", "surrogateescape"))
            finally:
                active[0] = True

    def audit(event: str, args: tuple) -> None:
        if event == "open":
            record("O", args[0])
        elif event in ("os.listdir", "os.scandir"):
            record("L", args[0] if args else ".")

    real_stat, real_lstat = os.stat, os.lstat

    def stat(path, *args, **kwargs):
        record("S", path)
        return real_stat(path, *args, **kwargs)

    def lstat(path, *args, **kwargs):
        record("S", path)
        return real_lstat(path, *args, **kwargs)

    sys.addaudithook(audit)
    os.stat, os.lstat = stat, lstat
    pool = pa.default_memory_pool()

    gc.collect()
    try:  # reset VmHWM to the current RSS, so the peak is this window's (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        pass
    modules0 = len(sys.modules)
    rss0, arrow0, io0 = _status_bytes("VmRSS"), pool.max_memory(), _io()
    tracemalloc.start()
    active[0] = True
    t = time.perf_counter()
    ex = PlanExecutor(job["plan"], job["dp_rank"])
    batch = next(iter(ex))
    seconds = time.perf_counter() - t
    active[0] = False
    io1 = _io()
    traced_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    result = {
        "seconds": seconds,
        "rchar": io1["rchar"] - io0["rchar"],
        "syscr": io1["syscr"] - io0["syscr"],
        "traced_peak": traced_peak,
        "arrow_peak": pool.max_memory() - arrow0,
        "rss_peak": _status_bytes("VmHWM") - rss0,
        "mapped_rss": _mapped_rss(prefixes),
        "modules_imported": len(sys.modules) - modules0,
        "batch_tokens": int(batch["input_ids"].numel()) if "input_ids" in batch else None,
    }
    os.stat, os.lstat = real_stat, real_lstat
    os.close(log)
    ex.close()
    return result


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))))
