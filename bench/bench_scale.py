"""How the cost of one rank follows the corpus size: `mds index`, `mds plan` and
`PlanExecutor(plan, 0)` on synthetic corpora of growing rows and files.

Two kinds of source, each at several sizes (tests/scale_corpus.py writes them):

- `megatron`: one Megatron dataset whose `.idx` is written with numpy (64..448 tokens per
  sequence, one document) and whose `.bin` is a sparse file made with `os.truncate` (token
  ids read from its holes are zeros); 1M, 10M and 100M rows;
- `files`: many tiny JSONL files (4 lines each, token-id lists: exact lengths); 1k and 100k
  files. `--million-files` adds 1M: writing them takes ~1.5 min here (50k: 4.5 s), and
  `mds index` ~10 min (1M files: 579 s, 1.6 GB peak, on 2 shared cores).

For each corpus: `mds index`, then `mds plan` of 50 steps x 64 samples, dp_size 8 (time and
peak RSS of each command, run in its own child process through the CLI entry point; for the
plan also its peak bytes per corpus row, and below the table the growth per row), then in
a fresh child for rank 0, after importing torch, pyarrow and mds.executor: peak RSS above
that baseline, bytes read through read syscalls (/proc/self/io rchar) and time from
`PlanExecutor(plan, 0)` to its first micro-batch, and the median time of the following
micro-batches (one per step), each the median of 3 fresh processes. Only the public API is
used. The last rows give the ratio largest/smallest corpus. tests/executor/test_slice_cost.py
checks the same slope in CI.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from report import median_step_ms, proc_status_mb, write_report  # noqa: E402
from scale_corpus import (  # noqa: E402
    LINES_PER_FILE,
    MEGATRON_PATH,
    write_scale_config,
    write_small_files,
    write_sparse_megatron,
)

STEPS, SAMPLES, DP = 50, 64, 8
EXEC_RUNS = 3  # fresh rank-0 processes per corpus; the table shows each quantity's median
DATA_VERSION = 2  # of the synthetic data: a cached corpus of another version is rewritten
RSS_BUDGET_MB = 6000
# The executor holds nothing per corpus row; the planner ~9 bytes at its peak with the
# default cost (docs/plan-format.md, "Cost of planning"): the budget guards `mds plan`.
BYTES_PER_ROW_ESTIMATE = 12


# --- synthetic data ---------------------------------------------------------------------


def make(kind: str, root: Path, size: int) -> float:
    """Write the corpus under root/data; returns the seconds it took."""
    t = time.perf_counter()
    if kind == "megatron":
        write_sparse_megatron(root / MEGATRON_PATH, size)
    else:
        write_small_files(root / "data", size)
    return time.perf_counter() - t


# --- children ---------------------------------------------------------------------------


def child_cli(argv: list[str]) -> dict:
    """Run the `mds` CLI in this process; time it and read the peak RSS."""
    from mds.cli.main import run

    sys.argv = ["mds", *argv]
    t = time.perf_counter()
    code = 0
    try:
        run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return {"seconds": time.perf_counter() - t, "peak_mb": proc_status_mb("VmHWM"), "exit": code}


def _rchar() -> int:
    with open("/proc/self/io", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def child_exec(plan: str, steps: int) -> dict:
    """Rank 0's executor: RSS above the imports, bytes read and time to the first micro-batch,
    step times."""
    from slice_probe import preload

    preload()  # torch, pyarrow, mds.executor...: the import baseline, as in training
    from mds.executor import PlanExecutor

    base, read = proc_status_mb("VmRSS"), _rchar()
    t = time.perf_counter()
    ex = PlanExecutor(plan, 0)  # the default checks: stat of the starting chunk's files
    it = iter(ex)
    next(it)
    first = time.perf_counter() - t
    read = _rchar() - read
    return {
        "first_s": first,
        "read_mb": read / 1e6,
        "step_ms": median_step_ms(it, steps),
        "rss_above_imports_mb": proc_status_mb("VmHWM") - base,
    }


def run_child(args: list[str]) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=False
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    result = json.loads(lines[-1])
    if result.get("exit"):
        result["error"] = (out.stderr.strip().splitlines() or ["failed"])[-1][:200]
    return result


# --- driver -----------------------------------------------------------------------------


def measure(kind: str, size: int, data: Path, steps: int) -> dict:
    root = data / f"{kind}-{size}"
    row = {"kind": kind, "size": size}
    rows = size if kind == "megatron" else size * LINES_PER_FILE
    estimate = rows * BYTES_PER_ROW_ESTIMATE / 1e6
    if estimate > RSS_BUDGET_MB:
        row["note"] = f"skipped: ~{estimate:.0f} MB per process exceeds {RSS_BUDGET_MB} MB"
        return row
    marker = root / "made.json"
    made = json.loads(marker.read_text()) if marker.exists() else {}
    if made.get("version") != DATA_VERSION:
        shutil.rmtree(root, ignore_errors=True)
        made = {"version": DATA_VERSION, "seconds": make(kind, root, size)}
        marker.write_text(json.dumps(made))
    row["create_s"] = made["seconds"]
    config = write_scale_config(root, kind, steps=STEPS, samples_per_step=SAMPLES, dp_size=DP)
    shutil.rmtree(root / "index", ignore_errors=True)
    row["index"] = run_child(["--child-cli", "index", str(config), "-o", str(root / "index")])
    row["plan"] = run_child(
        [
            "--child-cli",
            "plan",
            str(config),
            "--index",
            str(root / "index"),
            "-o",
            str(root / "plan.mds"),
        ]
    )
    if "error" not in row["plan"]:
        runs = [
            run_child(["--child-exec", str(root / "plan.mds"), str(steps)])
            for _ in range(EXEC_RUNS)
        ]
        failed = [r for r in runs if "error" in r]
        row["exec"] = (
            failed[0] if failed else {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        )
    return row


def _fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def corpus_rows(r: dict) -> int:
    return r["size"] if r["kind"] == "megatron" else r["size"] * LINES_PER_FILE


def plan_bytes_per_row(r: dict) -> float | None:
    """The plan command's peak RSS over the corpus rows (imports included)."""
    peak = r.get("plan", {}).get("peak_mb")
    return None if peak is None else peak * 2**20 / corpus_rows(r)


def marginal_plan_bytes(rows: list[dict], kind: str) -> str | None:
    """Planner peak RSS growth per corpus row between the smallest and largest corpus."""
    done = [r for r in rows if r["kind"] == kind and "peak_mb" in r.get("plan", {})]
    if len(done) < 2:
        return None
    a, b = done[0], done[-1]
    grown = (b["plan"]["peak_mb"] - a["plan"]["peak_mb"]) * 2**20
    per_row = grown / (corpus_rows(b) - corpus_rows(a))
    return (
        f"{kind}: `mds plan` peak RSS grows by {per_row:.1f} bytes per corpus row "
        f"({corpus_rows(a):,} -> {corpus_rows(b):,} rows)"
    )


def table(rows: list[dict]) -> str:
    head = (
        "| source | size | create s | index s | index peak MB | plan s | plan peak MB "
        "| plan B/row | exec RSS MB | exec read MB | first batch s | step ms | note |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
    )
    lines = []
    for r in rows:
        i, p, e = r.get("index", {}), r.get("plan", {}), r.get("exec", {})
        note = r.get("note") or i.get("error") or p.get("error") or e.get("error") or ""
        unit = "rows" if r["kind"] == "megatron" else "files"
        lines.append(
            f"| {r['kind']} | {r['size']:,} {unit} | {_fmt(r.get('create_s'))} "
            f"| {_fmt(i.get('seconds'))} | {_fmt(i.get('peak_mb'), 'd')} "
            f"| {_fmt(p.get('seconds'))} | {_fmt(p.get('peak_mb'), 'd')} "
            f"| {_fmt(plan_bytes_per_row(r), '.1f')} "
            f"| {_fmt(e.get('rss_above_imports_mb'), 'd')} | {_fmt(e.get('read_mb'))} "
            f"| {_fmt(e.get('first_s'))} "
            f"| {_fmt(e.get('step_ms'))} | {note} |"
        )
    ratios = []
    for kind in ("megatron", "files"):
        done = [
            r for r in rows if r["kind"] == kind and "rss_above_imports_mb" in r.get("exec", {})
        ]
        if len(done) < 2:
            continue
        a, b = done[0], done[-1]
        ratio = b["size"] / a["size"]

        def q(get, a=a, b=b):
            x, y = get(a), get(b)
            return f"{y / x:.2f}" if x else "-"

        ratios.append(
            f"| {kind} ratio {b['size']:,}/{a['size']:,} (x{ratio:.0f}) | | | "
            f"{q(lambda r: r['index']['seconds'])} | {q(lambda r: r['index']['peak_mb'])} "
            f"| {q(lambda r: r['plan']['seconds'])} | {q(lambda r: r['plan']['peak_mb'])} | | "
            f"| {q(lambda r: max(r['exec']['rss_above_imports_mb'], 1))} "
            f"| {q(lambda r: max(r['exec']['read_mb'], 0.01))} "
            f"| {q(lambda r: r['exec']['first_s'])} | {q(lambda r: r['exec']['step_ms'])} | |"
        )
    note = (
        "\nRatios: largest corpus over smallest; a rank whose cost depends only on its own "
        "slice of the plan shows ~1 in the exec columns.\n"
    )
    marginal = [m for kind in ("megatron", "files") if (m := marginal_plan_bytes(rows, kind))]
    if marginal:
        note += "\n" + "\n".join(f"- {m}" for m in marginal) + "\n"
    return head + "\n".join(lines + ratios) + "\n" + note


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child-cli":
        print(json.dumps(child_cli(sys.argv[2:])))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child-exec":
        print(json.dumps(child_exec(sys.argv[2], int(sys.argv[3]))))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build/bench"))
    ap.add_argument("--data", type=Path, default=Path("build/bench-data/scale"))
    ap.add_argument("--quick", action="store_true", help="1M/3M rows, 1k/10k files")
    ap.add_argument("--rows", type=int, nargs="*", help="Megatron sizes (rows)")
    ap.add_argument(
        "--files",
        type=int,
        nargs="*",
        help="small-file sizes (files); 1M files takes ~10 min and ~1.6 GB to index on 2 cores",
    )
    ap.add_argument("--million-files", action="store_true", help="also a source of 1M small files")
    ap.add_argument("--steps", type=int, default=10, help="micro-batches timed after the first")
    a = ap.parse_args()
    rows = a.rows or ([1_000_000, 3_000_000] if a.quick else [1_000_000, 10_000_000, 100_000_000])
    files = a.files or ([1_000, 10_000] if a.quick else [1_000, 100_000])
    if a.million_files:
        files = sorted({*files, 1_000_000})
    results = []
    for kind, sizes in (("megatron", rows), ("files", files)):
        for size in sizes:
            print(f"{kind} {size:,} ...", flush=True)
            results.append(measure(kind, size, a.data, a.steps))
    write_report(
        a.out,
        "scale",
        "# Scale: one rank against the corpus size\n\n" + table(results),
        {"rows": results, "steps": STEPS, "samples_per_step": SAMPLES, "dp_size": DP},
    )


if __name__ == "__main__":
    main()
