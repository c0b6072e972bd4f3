"""Per-step fetch time against the number of sources: mds against Mosaic streaming on the
same samples in the same order.

N Parquet sources of 400 token-list rows each (N = 64, 256, 1024), one plan of 64 samples per
step (dp_size 1, one micro-batch). mds replays it in-process and with
`ex.dataloader(num_workers=2)`. Mosaic streaming (`mosaicml-streaming`) reads the very same
rows from MDS shards it wrote (one stream per source), by global sample index in the plan's
order, in-process and through a torch DataLoader of 2 workers whose batch sampler yields the
plan's steps. Mosaic runs in its own virtual environment (build/bench/peer-venv) that this
script creates; if that fails, mds is reported alone with the reason.

Each measurement runs in a fresh child process: median ms per step (after one warm-up step)
and peak RSS above the imports; the table shows the median of `--repeat` runs. mds and
Mosaic runs alternate, each after every file of the data set was read (from the page cache).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import proc_status_mb, write_report  # noqa: E402

ROWS = 400
SAMPLES = 64
TORCH = "torch==2.13.0"  # the local CPU wheel; any other spec may pull a CUDA build


# --- data and plan ----------------------------------------------------------------------


def make_data(root: Path, n: int, steps: int, python: str, rows: int = ROWS) -> Path:
    """N Parquet sources of `rows` rows (one row group each up to pyarrow's default of 1Mi
    rows), the config and index, and a plan of `steps` steps for them (all kept between
    runs); returns the plan."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    plan = root / f"plan-{steps}.mds"
    if plan.exists():
        return plan
    (root / "src").mkdir(parents=True, exist_ok=True)
    lines = []
    for s in range(n):
        rng = np.random.default_rng([7, s])
        lengths = rng.integers(64, 512, rows)
        values = rng.integers(0, 50_000, int(lengths.sum()), dtype=np.int32)
        offsets = np.zeros(rows + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        path = root / "src" / f"s{s:04d}.parquet"
        if not path.exists():
            pq.write_table(pa.table({"tokens": tokens}), path)
        lines.append(
            f'[[source]]\nname = "s{s:04d}"\npath = "src/s{s:04d}.parquet"\n'
            'tokens = "tokens"\nweight = 1.0\n'
        )
    (root / f"mds-{steps}.toml").write_text(
        '[index]\noutput = "index"\n\n'
        + "\n".join(lines)
        + f"\n[train]\nsteps = {steps}\ndp_size = 1\nmicro_batches = 1\n"
        f"samples_per_step = {SAMPLES}\nmax_tokens_per_micro_batch = 65536\nseed = 3\n"
        'overlong = "error"\n\n'
        "[cost]\nmodel = { layers = 12, hidden = 768, vocab = 50000 }\n"
    )
    mds = str(Path(python).with_name("mds"))
    config = f"mds-{steps}.toml"
    if not (root / "index" / "manifest.json").exists():
        subprocess.run(
            [mds, "index", config, "-o", "index"], cwd=root, check=True, capture_output=True
        )
    subprocess.run(
        [mds, "plan", config, "--index", "index", "-o", plan.name],
        cwd=root,
        check=True,
        capture_output=True,
    )
    return plan


def plan_order(plan: Path, limit: int | None = None) -> list[list[tuple[int, int]]]:
    """(source, row) of every sample, step by step, as the executor hands them out (of the
    first `limit` steps only, if given; kept beside the plan)."""
    out = plan.with_suffix(".order.json")
    if out.exists():
        steps = json.loads(out.read_text())
        if limit is None or len(steps) >= limit:  # else made for fewer steps: made again
            return steps if limit is None else steps[:limit]
    from itertools import islice

    from mds.executor import PlanExecutor

    steps = [
        list(zip(b["source"].tolist(), b["row"].tolist(), strict=True))
        for b in islice(PlanExecutor(plan, 0, verify="none"), limit)
    ]
    out.write_text(json.dumps(steps))
    return steps


# --- children ---------------------------------------------------------------------------


def step_times(it, steps: int) -> dict:
    """The first step's time (start-up), then the mean (total / steps: throughput, reads
    ahead included) and the median of the next `steps`, in ms."""
    t = time.perf_counter()
    next(it)
    first = time.perf_counter() - t
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        next(it)
        times.append(time.perf_counter() - t)
    return {
        "first_ms": 1000 * first,
        "step_ms": 1000 * sum(times) / len(times),
        "median_ms": 1000 * statistics.median(times),
    }


def child_mds(plan: Path, workers: int, steps: int, max_open_files: int) -> dict:
    import torch  # noqa: F401

    from mds.executor import PlanExecutor

    base = proc_status_mb("VmRSS")
    ex = PlanExecutor(plan, 0, verify="none", max_open_files=max_open_files)
    it = iter(ex.dataloader(num_workers=workers) if workers else ex)
    return {**step_times(it, steps), "rss_mb": proc_status_mb("VmHWM") - base}


def mosaic_batches(plan: Path, rows: int = ROWS) -> list[list[int]]:
    """The plan's steps (`plan_order`) as lists of Mosaic global sample indices: source
    offset + row, every source holding `rows` samples, streams in source order."""
    order = json.loads(plan.with_suffix(".order.json").read_text())
    return [[s * rows + r for s, r in step] for step in order]


def mosaic_dataset(plan: Path, rows: int = ROWS):
    """Map-style access (`ds[i]`: token ids) to the Mosaic copy of the plan's data."""
    import torch
    from streaming import Stream, StreamingDataset

    root = plan.parent
    n = len(list((root / "mosaic").iterdir()))
    size = n * rows

    class ByIndex(torch.utils.data.Dataset):
        """Map-style access to the StreamingDataset (forked into the workers)."""

        def __init__(self, ds):
            self.ds = ds

        def __len__(self):
            return size

        def __getitem__(self, i):
            return self.ds[i]["tokens"]

    streams = [Stream(local=str(root / "mosaic" / f"s{s:04d}")) for s in range(n)]
    ds = StreamingDataset(streams=streams, shuffle=False, batch_size=SAMPLES)
    return ByIndex(ds)


def mosaic_steps(ds, batches: list[list[int]], workers: int):
    """An iterator over the plan's steps read from `ds`: one index at a time in-process, or
    a torch DataLoader of `workers` workers whose batch sampler yields the steps."""
    import torch

    if workers:
        loader = torch.utils.data.DataLoader(
            ds, batch_sampler=batches, num_workers=workers, collate_fn=list
        )
        return iter(loader)
    return ([ds[i] for i in b] for b in batches)


def child_mosaic(plan: Path, workers: int, steps: int) -> dict:
    import streaming  # noqa: F401
    import torch  # noqa: F401

    batches = mosaic_batches(plan)
    base = proc_status_mb("VmRSS")
    it = mosaic_steps(mosaic_dataset(plan), batches, workers)
    return {**step_times(it, steps), "rss_mb": proc_status_mb("VmHWM") - base}


def child_write_mosaic(root: Path) -> dict:
    import pyarrow.parquet as pq
    from streaming import MDSWriter

    for path in sorted((root / "src").glob("*.parquet")):
        col = pq.read_table(path).column("tokens").combine_chunks()
        offsets, values = col.offsets.to_numpy(), col.values.to_numpy()
        with MDSWriter(
            out=str(root / "mosaic" / path.stem),
            columns={"tokens": "ndarray:int32"},
            compression=None,
        ) as w:
            for lo, hi in zip(offsets[:-1], offsets[1:], strict=True):
                w.write({"tokens": np.ascontiguousarray(values[lo:hi], dtype=np.int32)})
    return {}


# --- driver -----------------------------------------------------------------------------


def peer_venv(out: Path) -> tuple[str | None, str]:
    """The Python of the Mosaic venv (created on first use), or None and why not."""
    venv = out / "peer-venv"
    python = venv / "bin" / "python"
    ok = (
        python.exists()
        and subprocess.run(
            [str(python), "-c", "import streaming, torch, pyarrow"], capture_output=True
        ).returncode
        == 0
    )
    if not ok:
        try:
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            pip = [str(python), "-m", "pip", "install", "-q"]
            subprocess.run([*pip, TORCH], check=True)
            pins = out / "peer-constraints.txt"
            pins.write_text(TORCH + "\n")
            subprocess.run([*pip, "-c", str(pins), "mosaicml-streaming", "pyarrow"], check=True)
        except (subprocess.CalledProcessError, OSError) as exc:
            return None, f"peer venv could not be created ({exc})"
    if subprocess.run([str(python), "-c", "import streaming"], capture_output=True).returncode:
        _stub_torchvision(python)
    check = subprocess.run(
        [str(python), "-c", "import streaming, torch"], capture_output=True, text=True
    )
    if check.returncode:
        return None, f"mosaicml-streaming does not import ({check.stderr.strip().splitlines()[-1]})"
    version = subprocess.run(
        [str(python), "-c", "import streaming; print(streaming.__version__)"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return str(python), f"mosaicml-streaming {version}"


def _stub_torchvision(python: Path) -> None:
    """`import streaming` imports its vision datasets, hence torchvision, whose PyPI build
    does not load against the CPU torch wheel. Token data needs none of it: replace it by
    the three names the import touches."""
    subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", "torchvision"], check=False)
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    stub = Path(site) / "torchvision"
    (stub / "datasets").mkdir(parents=True, exist_ok=True)
    (stub / "transforms").mkdir(exist_ok=True)
    (stub / "__init__.py").write_text('"""Stub: the vision part of streaming is not used."""\n')
    (stub / "datasets" / "__init__.py").write_text(
        "class VisionDataset:\n    pass\n\n\nclass CIFAR10(VisionDataset):\n    pass\n"
    )
    (stub / "transforms" / "__init__.py").write_text("")
    (stub / "transforms" / "functional.py").write_text(
        "def to_tensor(x):\n    raise NotImplementedError\n"
    )


def run_child(python: str, args: list[str], script: str = __file__) -> dict:
    """Run `script` with `args` in a fresh process of `python`; its last JSON line."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent)}
    out = subprocess.run([python, script, *args], capture_output=True, text=True, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    return json.loads(lines[-1])


def median(
    runs: list[dict], keys: tuple[str, ...] = ("first_ms", "step_ms", "median_ms", "rss_mb")
) -> dict:
    good = [r for r in runs if "error" not in r]
    if not good:
        return runs[0]
    return {k: statistics.median(r[k] for r in good) for k in keys if k in good[0]}


def warm(root: Path) -> None:
    """Read every file of a data set (sources, plan, Mosaic shards) before a run, so each
    starts from the page cache: a machine that pages out files left alone for a while
    (DAMON reclaim here pages out what is not touched for a minute) would otherwise have
    whichever side runs after a pause read from disk."""
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as fh:
                while fh.read(1 << 20):
                    pass


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1].startswith("--child-"):
        what, root = sys.argv[1], Path(sys.argv[2])
        if what == "--child-write-mosaic":
            result = child_write_mosaic(root)
        elif what == "--child-mds":
            result = child_mds(root, int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        else:
            result = child_mosaic(root, int(sys.argv[3]), int(sys.argv[4]))
        print(json.dumps(result))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build/bench"))
    ap.add_argument("--data", type=Path, default=Path("build/bench-data/peers"))
    ap.add_argument("--sources", type=int, nargs="*", default=[64, 256, 1024])
    ap.add_argument("--steps", type=int, default=512, help="steps timed per run")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-open-files", type=int, default=64)
    ap.add_argument("--no-peer", action="store_true", help="measure mds alone")
    ap.add_argument("--quick", action="store_true", help="64 and 256 sources, 10 steps, 1 run")
    a = ap.parse_args()
    if a.quick:
        a.sources, a.steps, a.repeat = [64, 256], 128, 1
    peer, peer_note = (None, "not asked for") if a.no_peer else peer_venv(a.out)
    rows = []
    for n in a.sources:
        root = (a.data / f"n{n}").resolve()
        plan = make_data(root, n, a.steps + 2, sys.executable)
        plan_order(plan)
        row = {"sources": n}
        if peer and not (root / "mosaic").exists():
            run_child(peer, ["--child-write-mosaic", str(root)])
        # mds and Mosaic runs alternate, so a machine that drifts (load, memory) drifts
        # for both sides alike
        for workers, ours, theirs in ((0, "mds", "mosaic"), (2, "mds_dl2", "mosaic_dl2")):
            runs: dict[str, list[dict]] = {ours: [], theirs: []}
            for _ in range(a.repeat):
                warm(root)
                runs[ours].append(
                    run_child(
                        sys.executable,
                        [
                            "--child-mds",
                            str(plan),
                            str(workers),
                            str(a.steps),
                            str(a.max_open_files),
                        ],
                    )
                )
                if peer:
                    warm(root)
                    runs[theirs].append(
                        run_child(peer, ["--child-mosaic", str(plan), str(workers), str(a.steps)])
                    )
            row.update({label: median(got) for label, got in runs.items() if got})
        rows.append(row)
        print(json.dumps(row), flush=True)
    write_report(a.out, "peers", table(rows, peer_note, a), {"rows": rows, "peer": peer_note})


def table(rows: list[dict], peer_note: str, a) -> str:
    def cell(r: dict, key: str, field: str, spec: str) -> str:
        v = r.get(key, {})
        return v.get("error", "-")[:60] if field not in v else format(v[field], spec)

    def ratio(r: dict, ours: str, theirs: str) -> str:
        x, y = r.get(ours, {}).get("step_ms"), r.get(theirs, {}).get("step_ms")
        return f"{x / y:.2f}" if x and y else "-"

    head = (
        f"# Per-step fetch: mds against Mosaic streaming ({peer_note})\n\n"
        f"{SAMPLES} samples per step, {ROWS} rows per source, median of {a.repeat} runs. "
        f"`first`: the first step, ms (start-up). `ms/step`: the mean of the {a.steps} steps "
        "after it (total time / steps: reads ahead and decodes included). RSS: MB above the "
        f"imports. max_open_files={a.max_open_files}. Ratio < 1: mds is faster.\n\n"
        "| sources | mds first | mds ms/step | mds RSS | Mosaic first | Mosaic ms/step "
        "| Mosaic RSS | mds/Mosaic | mds 2 workers ms/step | Mosaic 2 workers ms/step "
        "| mds/Mosaic (2 workers) |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = [
        f"| {r['sources']} | {cell(r, 'mds', 'first_ms', '.0f')} "
        f"| {cell(r, 'mds', 'step_ms', '.2f')} | {cell(r, 'mds', 'rss_mb', '.0f')} "
        f"| {cell(r, 'mosaic', 'first_ms', '.0f')} | {cell(r, 'mosaic', 'step_ms', '.2f')} "
        f"| {cell(r, 'mosaic', 'rss_mb', '.0f')} | {ratio(r, 'mds', 'mosaic')} "
        f"| {cell(r, 'mds_dl2', 'step_ms', '.2f')} | {cell(r, 'mosaic_dl2', 'step_ms', '.2f')} "
        f"| {ratio(r, 'mds_dl2', 'mosaic_dl2')} |"
        for r in rows
    ]
    return head + "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
