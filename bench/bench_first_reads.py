"""Benchmark `first_reads` on an object store whose requests have latency: many small
Parquet sources in an S3-protocol server (moto's, as the tests start it) behind the tests'
fault proxy (tests/fault_proxy.py) with a "delay" rule on every request (default 20 ms, a
same-region S3 first byte), replayed by rank 0 with `first_reads=16` (on, the default for
objects) and 0 (off), with the start-up file check `--verify` (default "stat", the
executor's default).

Each run is a fresh child process (cold metadata cache, cold block cache), the settings
alternating; the table gives per setting the median of `--repeat` runs of the
construction, the first 16 steps and the steady ms/step of the `--steps` steps after them,
the requests of a run (HEAD and GET), and the ratio off / on of the first 16 steps. The data
and plan are bench_peers.py's builders (`--sources` x `--rows`, 64 samples a step; one row
group a file) under build/bench-data/first_reads/: `--sources 4 --rows 32768` gives row
groups too large for the memory budget to decode whole, read from their pages.
`--baseline SRC` runs every setting with the mds package under SRC too (another checkout's
`src`), alternating with this one: before/after in one run. Timings are reported, never
asserted.

`--trace DIR` writes each run's object opens (HEAD) and range reads (GET) with their thread
and times (the code measured wrapped in the child: pyarrow's open and the range reads).

Usage: python bench/bench_first_reads.py [--out build/bench] [--repeat 3] [--delay-ms 20]
       [--verify stat|none|full] [--sources 256 --rows 2048] [--baseline ../main/src]
       [--trace build/bench/first_reads-trace]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from bench_peers import make_data, median  # noqa: E402
from report import write_report  # noqa: E402

FIRST = 16  # steps counted as start-up
BUCKET = "bench"
KEYS = ("start_ms", "first16_ms", "step_ms")
ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def traced(out: Path) -> tuple[Callable[[str, str, float], None], Callable[[], None]]:
    """Time every object open (pyarrow's, a HEAD) and every range read (a GET) this process
    makes, on the thread it is made on: (mark(kind, what, since), write to `out`), times
    in ms since the call. For `--trace`: where a start's or a step's time goes."""
    from mds.core import storage

    zero, events, lock = time.perf_counter(), [], threading.Lock()

    def mark(kind: str, what: str, since: float) -> None:
        now = time.perf_counter()
        with lock:
            events.append(
                (threading.current_thread().name, kind, what,
                 round(1000 * (since - zero), 1), round(1000 * (now - zero), 1))
            )

    class Timed:
        def __init__(self, fs):
            self._fs = fs

        def open_input_file(self, key: str):
            since = time.perf_counter()
            try:
                return self._fs.open_input_file(key)
            finally:
                mark("HEAD", key, since)

        def __getattr__(self, name: str):
            return getattr(self._fs, name)

    filesystem, read_into = storage.filesystem, storage._read_into
    storage.filesystem = lambda url: Timed(filesystem(url))

    def timed_read(f, url, size, start, want, fill):
        since = time.perf_counter()
        try:
            return read_into(f, url, size, start, want, fill)
        finally:
            mark("GET", f"{url} [{start}, {start + want})", since)

    storage._read_into = timed_read
    return mark, lambda: out.write_text("\n".join(json.dumps(e) for e in events) + "\n")


def child(
    plan: Path, url: str, first_reads: int, steps: int, verify: str, trace: Path | None = None
) -> dict:
    """One run: construction, the first FIRST steps, then `steps` more (mean ms)."""
    mark, write = traced(trace) if trace is not None else (lambda *a: None, lambda: None)
    from mds.executor import PlanExecutor

    t0 = time.perf_counter()
    ex = PlanExecutor(plan, 0, data_root=url, verify=verify, first_reads=first_reads)
    it = iter(ex)
    t1 = time.perf_counter()
    mark("STEP", "construction", t0)
    for k in range(FIRST):
        since = time.perf_counter()
        next(it)
        mark("STEP", f"step {k}", since)
    t2 = time.perf_counter()
    for _ in range(steps):
        next(it)
    t3 = time.perf_counter()
    ex.close()
    write()
    return {
        "start_ms": 1000 * (t1 - t0),
        "first16_ms": 1000 * (t2 - t1),
        "step_ms": 1000 * (t3 - t2) / steps,
    }


def serve():
    """moto's S3 server on 127.0.0.1 with the bucket; the server and its endpoint."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


def upload(endpoint: str, directory: Path, prefix: str) -> str:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    for path in sorted(directory.rglob("*.parquet")):
        key = f"{prefix}/{path.relative_to(directory).as_posix()}"
        client.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes())
    return f"s3://{BUCKET}/{prefix}"


def run_child(args: list[str], src: str | None) -> dict:
    """This script with `args` in a fresh process, importing mds from `src` if given (else
    the installed one); its last JSON line."""
    path = [str(HERE)] if src is None else [src, str(HERE)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    out = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, env=env
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    return json.loads(lines[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        plan, url, first, steps, verify, trace = sys.argv[2:8]
        result = child(
            Path(plan), url, int(first), int(steps), verify, Path(trace) if trace else None
        )
        print(json.dumps(result))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build/bench"))
    ap.add_argument("--data", type=Path, default=Path("build/bench-data/first_reads"))
    ap.add_argument("--sources", type=int, default=256)
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=32, help="steady steps timed after the first 16")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--delay-ms", type=float, default=20.0, help="added to every request")
    ap.add_argument("--verify", default="stat", choices=("stat", "none", "full"))
    ap.add_argument("--first-reads", default="16,0", help="settings to run, comma-separated")
    ap.add_argument("--baseline", help="the src directory of the code to compare with")
    ap.add_argument("--src", help="the src directory of the code measured (default: installed)")
    ap.add_argument(
        "--trace",
        type=Path,
        help="a directory: each run writes there, a JSON line each, every object open (HEAD) "
        "and range read (GET) with its thread and times, and the construction and first steps",
    )
    a = ap.parse_args()
    try:
        import moto.server  # noqa: F401
    except ImportError:
        print("bench_first_reads: moto[server] is not installed (make setup installs it); skipped")
        return
    from fault_proxy import FaultProxy

    root = a.data / f"{a.sources}x{a.rows}"
    plan = make_data(root, a.sources, FIRST + a.steps, sys.executable, rows=a.rows).resolve()
    os.environ.update(ENV)
    server, endpoint = serve()
    proxy = None
    codes = {"this": a.src} if a.baseline is None else {"before": a.baseline, "after": a.src}
    settings = [
        (code, value)
        for value in a.first_reads.split(",")
        for code in codes
    ]
    runs: dict[tuple, list[dict]] = {s: [] for s in settings}
    requests: dict[tuple, dict[str, int]] = {}
    try:
        url = upload(endpoint, root, "data")

        proxy = FaultProxy(endpoint)
        threading.Thread(target=proxy.server.serve_forever, args=(0.05,), daemon=True).start()
        for method in ("GET", "HEAD"):
            proxy.add(method, "*", "delay", seconds=a.delay_ms / 1000)
        os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
        if a.trace is not None:
            a.trace.mkdir(parents=True, exist_ok=True)
        for run in range(a.repeat):
            for code, value in settings:
                before = len(proxy.log)
                trace = "" if a.trace is None else str(a.trace / f"{code}-{value}-{run}.jsonl")
                result = run_child(
                    ["--child", str(plan), url, value, str(a.steps), a.verify, trace],
                    codes[code],
                )
                methods = [m for m, *_ in proxy.log[before:]]
                requests[(code, value)] = {m: methods.count(m) for m in ("HEAD", "GET")}
                print(code, value, result, requests[(code, value)], flush=True)
                runs[(code, value)].append(result)
    finally:
        if proxy is not None:
            proxy.clear()
            proxy.server.shutdown()
            proxy.server.server_close()
        server.stop()
    med = {s: median(rs, KEYS) for s, rs in runs.items()}
    lines = [
        f"{a.sources} sources x {a.rows} rows in moto's S3 server behind a proxy adding "
        f"{a.delay_ms:g} ms to every request; rank 0, 64 samples a step, verify="
        f"{a.verify!r}; medians of {a.repeat} fresh processes, settings alternating.",
        "",
        "| code | first_reads | start ms | first 16 steps ms | steady ms/step "
        "| requests a run (HEAD + GET) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for (code, value), m in med.items():
        if "error" in m:
            lines.append(f"| {code} | {value} | error: {m['error']} | | | |")
            continue
        n = requests[(code, value)]
        lines.append(
            f"| {code} | {value} | {m['start_ms']:.0f} | {m['first16_ms']:.0f} "
            f"| {m['step_ms']:.1f} | {n['HEAD'] + n['GET']} ({n['HEAD']} + {n['GET']}) |"
        )
    lines.append("")
    for code in codes:
        on, off = med.get((code, "16"), {"error": 1}), med.get((code, "0"), {"error": 1})
        if "error" not in on and "error" not in off:
            ratio = off["first16_ms"] / on["first16_ms"]
            lines.append(f"{code}: first 16 steps, off / on: {ratio:.2f}")
    if a.baseline is not None:
        for value in a.first_reads.split(","):
            b, n = med[("before", value)], med[("after", value)]
            if "error" not in b and "error" not in n:
                ratio = b["first16_ms"] / n["first16_ms"]
                lines.append(f"first_reads={value}: first 16 steps, before / after: {ratio:.2f}")
    text = "\n".join(lines)
    data = {
        "runs": {f"{c} {v}": r for (c, v), r in runs.items()},
        "medians": {f"{c} {v}": m for (c, v), m in med.items()},
        "requests": {f"{c} {v}": n for (c, v), n in requests.items()},
    }
    write_report(a.out, "first_reads", text, data)


if __name__ == "__main__":
    main()
