"""Selective fan-out on a long-context mix: the bytes one DP rank's reading peer sends per
step to its TP x CP x PP peers, each receiving only its part (`shared(selective=True)`),
against every peer receiving the whole micro-batch.

The mesh: PP = 4, CP = 2, TP = 2, 16 peers per DP rank (the reader and 15 others). The mix
is bench_cp.py's: 60% of documents log-uniform in [1k, 4k) tokens, 40% log-uniform in
[1k, 128k]; D = 8 DP ranks, 4 micro-batches of 128k tokens, 256 documents a step, a 7B-like
causal cost; balanced over DP ranks and micro-batches by the planner's balancer. Each
micro-batch is built in memory (random token ids, no data on disk) by the executor's own
functions (`mds.executor.batch.compact` / `expand`, the CP layout by `mds.executor.cp.layout`
with the default `cp_split_from`), and its parts are cut and counted by the functions
`shared(selective=True)` uses: `mds.executor.broadcast.peer_part`, `part_bytes` and
`fanout_bytes` (headers included).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cp import CAPACITY, LINEAR, MICRO, PER_STEP, SEED, D, plan  # noqa: E402
from report import write_report  # noqa: E402

from mds.executor.batch import compact, expand
from mds.executor.broadcast import fanout_bytes, part_bytes, peer_part
from mds.executor.cp import CPSettings, layout
from mds.planner.plan.config import DEFAULT_CP_SPLIT_FROM

TP, CP, PP = 2, 2, 4
VOCAB = 128_000
ROLES = ("first stage", "middle stage", "last stage")


def micro_batch(rng, lengths: np.ndarray, step: int, micro: int, settings: CPSettings) -> dict:
    """The whole micro-batch the reading peer's executor yields for these samples."""
    tokens = [rng.integers(0, VOCAB, int(n), dtype=np.int64) for n in lengths]
    n = len(lengths)
    raw = compact(
        tokens,
        source=np.zeros(n, dtype=np.int32),
        sample_id=np.arange(n, dtype=np.int64),
        row=np.arange(n, dtype=np.int64),
        step=step,
        micro_batch=micro,
    )
    raw["cp_layout"] = layout(lengths.astype(np.int64), settings)
    raw["cp_size"] = settings.size
    return expand(raw)


def role(stage: int) -> str:
    return ROLES[0] if stage == 0 else ROLES[2] if stage == PP - 1 else ROLES[1]


def run(steps: int) -> dict:
    rng = np.random.default_rng(SEED)
    L, valid, assign = plan(rng, steps, PER_STEP)
    settings = CPSettings(CP, DEFAULT_CP_SPLIT_FROM, LINEAR)
    ids_rng = np.random.default_rng(SEED + 2)
    rows = []  # one per (step, DP rank)
    t0 = time.perf_counter()
    for t in range(steps):
        for d in range(D):
            row = {"tokens": 0, "selective": 0, "broadcast": 0, "peer_max": 0, "whole_peer": 0}
            row |= {r: 0 for r in ROLES}
            for m in range(MICRO):
                pick = np.flatnonzero(valid[t] & (assign.rank[t] == d) & (assign.micro[t] == m))
                whole = micro_batch(ids_rng, L[t, pick], t, m, settings)
                sent = fanout_bytes(whole, tp=TP, cp=CP, pp=PP)
                row["selective"] += sent["selective"]
                row["broadcast"] += sent["broadcast"]
                row["tokens"] += int(whole["input_ids"].numel())
                row["whole_peer"] += part_bytes(whole)
                # what each peer receives (the same parts fanout_bytes counted)
                per_peer = {}
                for c in range(CP):
                    for stage in range(PP):
                        got = part_bytes(peer_part(whole, cp_rank=c, stage=stage, pp=PP))
                        per_peer[c, stage] = got
                        row[role(stage)] += got * TP
                check = sum(b * (TP - 1 if k == (0, 0) else TP) for k, b in per_peer.items())
                assert check == sent["selective"], (check, sent)
                row["peer_max"] += max(per_peer.values())
            for r, stages in zip(ROLES, (1, PP - 2, 1), strict=True):
                row[r] //= CP * TP * stages  # per peer of that role
            rows.append(row)
    seconds = time.perf_counter() - t0

    def stat(key: str) -> dict:
        v = np.array([r[key] for r in rows], dtype=np.float64)
        return {"median": float(np.median(v)), "max": float(v.max()), "mean": float(v.mean())}

    ratio = np.array([r["selective"] / r["broadcast"] for r in rows])
    return {
        "mesh": {"tp": TP, "cp": CP, "pp": PP},
        "steps": steps,
        "dp": D,
        "micro_batches": MICRO,
        "capacity": CAPACITY,
        "split_from": DEFAULT_CP_SPLIT_FROM,
        "per_step": {
            k: stat(k)
            for k in ("tokens", "selective", "broadcast", "whole_peer", "peer_max", *ROLES)
        },
        "ratio": {
            "median": float(np.median(ratio)),
            "max": float(ratio.max()),
            "min": float(ratio.min()),
        },
        "seconds": round(seconds, 1),
    }


def table(res: dict) -> str:
    s = res["per_step"]

    def mb(key: str, q: str) -> str:
        return f"{s[key][q]:,.0f}"

    lines = [
        "| per DP rank and step | median | max |",
        "|---|---:|---:|",
        f"| tokens (4 micro-batches) | {s['tokens']['median']:,.0f} | {s['tokens']['max']:,.0f} |",
        f"| whole micro-batches to each of the 15 other peers, bytes | {mb('broadcast', 'median')} | "
        f"{mb('broadcast', 'max')} |",
        f"| selective fan-out, bytes | {mb('selective', 'median')} | {mb('selective', 'max')} |",
        f"| selective / whole (per step) | {res['ratio']['median']:.4f} | {res['ratio']['max']:.4f} |",
        f"| one peer, whole micro-batches, bytes | {mb('whole_peer', 'median')} | "
        f"{mb('whole_peer', 'max')} |",
        f"| one peer, selective, busiest peer, bytes | {mb('peer_max', 'median')} | "
        f"{mb('peer_max', 'max')} |",
    ]
    for r in ROLES:
        lines.append(f"| one {r} peer, selective, bytes | {mb(r, 'median')} | {mb(r, 'max')} |")
    lines.append("")
    lines.append(
        f"Mesh TP {TP} x CP {CP} x PP {PP} (16 peers per DP rank); {res['steps']} steps x {D} DP "
        f"ranks, {MICRO} micro-batches of up to {CAPACITY:,} tokens, documents 1k-128k tokens, "
        f"cp_split_from {DEFAULT_CP_SPLIT_FROM}; bytes include the JSON headers "
        f"(bench/bench_fanout.py, {res['seconds']} s)."
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    parser.add_argument("--steps", type=int, default=16)
    a = parser.parse_args()
    res = run(a.steps)
    write_report(a.out, "fanout", table(res), res)


if __name__ == "__main__":
    main()
