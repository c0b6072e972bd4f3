"""How the cost of one rank follows the corpus size: `mds index`, `mds plan` and
`PlanExecutor(plan, 0)` on synthetic corpora of growing rows and files.

Two kinds of source, each at several sizes, none costing real disk:

- `megatron`: one Megatron dataset whose `.idx` is written with numpy (256 tokens per
  sequence, one document) and whose `.bin` is a sparse file made with `os.truncate` (token
  ids read from its holes are zeros);
- `files`: many tiny JSONL files (4 lines each, token-id lists: exact lengths).

For each corpus: `mds index`, then `mds plan` of 50 steps x 64 samples, dp_size 8 (time and
peak RSS of each command, run in its own child process through the CLI entry point; for the
plan also its peak bytes per corpus row, and below the table the growth per row), then in
a fresh child for rank 0: peak RSS above the import baseline, time to the first micro-batch
of `PlanExecutor(plan, 0)`, and the median time of the following micro-batches (one per
step). Only the public API is used. The last rows give the ratio largest/smallest corpus.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import median_step_ms, proc_status_mb, write_report  # noqa: E402

TOKENS_PER_ROW = 256
LINES_PER_FILE = 4
STEPS, SAMPLES, DP = 50, 64, 8
RSS_BUDGET_MB = 6000
# Measured on this code: the executor holds ~30 bytes per corpus row; the planner ~9 at its
# peak with the default cost (docs/plan-format.md, "Cost of planning").
BYTES_PER_ROW_ESTIMATE = 32


# --- synthetic data ---------------------------------------------------------------------


def make_megatron(root: Path, rows: int) -> float:
    """A sparse Megatron dataset of `rows` sequences; returns the seconds it took."""
    t = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    idx, bin_ = root / "data.idx", root / "data.bin"
    header = struct.pack("<9sQBQQ", b"MMIDIDX\x00\x00", 1, 4, rows, 2)  # int32 tokens
    with open(idx, "wb") as f:
        f.write(header)
        chunk = 1 << 22
        for a in range(0, rows, chunk):
            f.write(np.full(min(chunk, rows - a), TOKENS_PER_ROW, dtype="<i4").tobytes())
        for a in range(0, rows, chunk):
            n = np.arange(a, min(a + chunk, rows), dtype="<i8")
            f.write((n * (TOKENS_PER_ROW * 4)).tobytes())
        f.write(np.array([0, rows], dtype="<i8").tobytes())
    with open(bin_, "wb") as f:
        os.truncate(f.fileno(), rows * TOKENS_PER_ROW * 4)
    return time.perf_counter() - t


def make_files(root: Path, files: int) -> float:
    """`files` tiny JSONL files, 1000 per directory; returns the seconds it took."""
    t = time.perf_counter()
    body = "".join(
        json.dumps({"tokens": list(range(200 + 10 * i))}) + "\n" for i in range(LINES_PER_FILE)
    ).encode()
    for i in range(files):
        d = root / f"d{i // 1000:05d}"
        if i % 1000 == 0:
            d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:07d}.jsonl").write_bytes(body)
    return time.perf_counter() - t


def write_config(root: Path, kind: str) -> Path:
    source = (
        'name = "mega"\npath = "data/data"\n'
        if kind == "megatron"
        else 'name = "small"\npath = "data/*/*.jsonl"\ntokens = "tokens"\n'
    )
    config = root / "mds.toml"
    config.write_text(
        f'[index]\noutput = "index"\n\n[[source]]\n{source}weight = 1.0\n\n'
        f"[train]\nsteps = {STEPS}\ndp_size = {DP}\nmicro_batches = 1\n"
        f"samples_per_step = {SAMPLES}\nmax_tokens_per_micro_batch = 65536\nseed = 1\n"
        'overlong = "error"\n\n[cost]\nmodel = { layers = 12, hidden = 768, vocab = 50000 }\n'
    )
    return config


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


def child_exec(plan: str, steps: int) -> dict:
    """Rank 0's executor: RSS above the imports, time to the first micro-batch, step times."""
    import torch  # noqa: F401  (part of the import baseline, as in training)

    from mds.executor import PlanExecutor

    base = proc_status_mb("VmRSS")
    t = time.perf_counter()
    ex = PlanExecutor(plan, 0, verify="none")
    it = iter(ex)
    next(it)
    first = time.perf_counter() - t
    return {
        "first_s": first,
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
    if not marker.exists():
        shutil.rmtree(root, ignore_errors=True)
        make = make_megatron if kind == "megatron" else make_files
        seconds = make(root / "data", size)
        marker.write_text(json.dumps({"seconds": seconds}))
    row["create_s"] = json.loads(marker.read_text())["seconds"]
    config = write_config(root, kind)
    shutil.rmtree(root / "index", ignore_errors=True)
    row["index"] = run_child(["--child-cli", "index", str(config), "-o", str(root / "index")])
    row["plan"] = run_child(
        ["--child-cli", "plan", str(config), "--index", str(root / "index"),
         "-o", str(root / "plan.mds")]
    )
    if "error" not in row["plan"]:
        row["exec"] = run_child(["--child-exec", str(root / "plan.mds"), str(steps)])
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
        "| plan B/row | exec RSS MB | first batch s | step ms | note |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
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
            f"| {_fmt(e.get('rss_above_imports_mb'), 'd')} | {_fmt(e.get('first_s'))} "
            f"| {_fmt(e.get('step_ms'))} | {note} |"
        )
    ratios = []
    for kind in ("megatron", "files"):
        done = [r for r in rows if r["kind"] == kind and "rss_above_imports_mb" in r.get("exec", {})]
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
            f"| {q(lambda r: r['plan']['seconds'])} | {q(lambda r: r['plan']['peak_mb'])} | "
            f"| {q(lambda r: max(r['exec']['rss_above_imports_mb'], 1))} "
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
        "--files", type=int, nargs="*",
        help="small-file sizes (files); 1M files takes over an hour to index on 2 cores",
    )
    ap.add_argument("--steps", type=int, default=10, help="micro-batches timed after the first")
    a = ap.parse_args()
    rows = a.rows or ([1_000_000, 3_000_000] if a.quick else [1_000_000, 10_000_000, 100_000_000])
    files = a.files or ([1_000, 10_000] if a.quick else [1_000, 100_000])
    results = []
    for kind, sizes in (("megatron", rows), ("files", files)):
        for size in sizes:
            print(f"{kind} {size:,} ...", flush=True)
            results.append(measure(kind, size, a.data, a.steps))
    write_report(a.out, "scale", "# Scale: one rank against the corpus size\n\n" + table(results),
                 {"rows": results, "steps": STEPS, "samples_per_step": SAMPLES, "dp_size": DP})


if __name__ == "__main__":
    main()
