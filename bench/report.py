"""Where every benchmark writes its results: `<out>/<name>.md` (the table, also printed)
and `<out>/<name>.json` (everything measured); and the measurements they share."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def write_report(out: Path, name: str, table: str, data: Any) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(table, encoding="utf-8")
    (out / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    print()
    print(table)


def proc_status_mb(field: str) -> int:
    """A /proc/self/status field (VmRSS, VmHWM) in MB; -1 where there is none."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) // 1024
    return -1


def median_step_ms(it: Iterator[Any], steps: int) -> float:
    """The median time of the next `steps` items of `it`, in ms (NaN if it has none)."""
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        if next(it, None) is None:
            break
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times) if times else float("nan")
