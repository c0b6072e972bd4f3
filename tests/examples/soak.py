"""Kill-and-resume soak: train examples/train_tiny.py with two torchrun ranks, SIGKILL the
whole job at seeded random moments, resume from the last checkpoint, and check at the end
that the samples the final model trained on are exactly the plan's: every step once, every
planned sample of it, nothing else. Every attempt at a step, including those lost to a
kill, must also have drawn exactly that step's planned samples. The runs read Parquet with
MDS_PAGE_READS=check (docs/executor.md): every read from pages is compared with pyarrow's.

    python tests/examples/soak.py --plan build/demo/plan-dp2.mds --kills 200 --steps 24

`make soak` runs it on the demo plan; tests/examples/test_soak.py runs a short version.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_tiny.py"
# The smallest model that still trains: a kill point costs a launch, not a long step.
MODEL = ["--layers", "1", "--d-model", "16", "--heads", "1", "--save-every", "1"]


@dataclass
class SoakResult:
    kills: int = 0  # kill points survived: each was followed by a resume
    launches: int = 0
    episodes: int = 0  # runs from step 0 to the end
    steps: int = 0  # steps of the final histories, over all episodes
    samples: int = 0


def planned_steps(plan: Path, steps: int) -> list[list[list[int]]]:
    """[step][rank] -> the plan's global sample ids, in plan order."""
    from mds.core.planfile_reader import PlanReader

    out = []
    with PlanReader(plan) as reader:
        for step in range(steps):
            chunk = reader.chunk_of(step)
            per_rank = []
            for rank in range(reader.dp):
                block = reader.rank_chunk(chunk, rank)
                counts = block.counts.ravel()
                local = (step - block.step_start) * reader.micro
                start = int(counts[:local].sum())
                size = int(counts[local : local + reader.micro].sum())
                per_rank.append(block.ids[start : start + size].tolist())
            out.append(per_rank)
    return out


def _launch(plan: Path, work: Path, steps: int, resume: bool) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(EXAMPLE), "--plan", str(plan), "--steps", str(steps),
        "--checkpoint", str(work / "ckpt"), "--log-json", str(work / "log.jsonl"), *MODEL,
    ]  # fmt: skip
    if resume:
        cmd.append("--resume")
    # Every Parquet read from pages is also decoded by pyarrow and compared (a difference
    # fails the run, naming the file and row): the soak's reads test the page reader too.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MDS_PAGE_READS": "check"}
    with open(work / "out.txt", "ab") as out:
        # A session of its own: torchrun's process group is the job's alone.
        return subprocess.Popen(cmd, stdout=out, stderr=out, env=env, start_new_session=True)


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            out.append(int(entry))
    return out


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting to be reaped does not)."""
    try:
        return Path("/proc", str(pid), "stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _kill_job(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun and its ranks (and their DataLoader workers). torchrun starts each
    rank in a session of its own, so a killpg of torchrun's group alone left the ranks running
    beside the next launch. torchrun is stopped first, so it starts no rank while they are
    listed; an AssertionError if a rank outlives the kill."""
    os.killpg(proc.pid, signal.SIGSTOP)
    ranks = _children(proc.pid)
    for pid in ranks:
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in ranks):
        if time.monotonic() > deadline:
            raise AssertionError(f"ranks {ranks} outlived the kill of their torchrun")
        time.sleep(0.05)


def _log_records(path: Path) -> list[dict]:
    records = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                pass  # torn by a kill
    return records


def soak(
    plan: Path, work: Path, *, kills: int, steps: int, seed: int, max_delay: float = 8.0
) -> SoakResult:
    """Train episodes (step 0 to `steps`) until `kills` SIGKILLs at seeded random moments
    have been survived; AssertionError if any attempt or final history differs from the plan."""
    rng = random.Random(seed)
    expected = planned_steps(plan, steps)
    result = SoakResult()
    while result.episodes == 0 or result.kills < kills:
        _episode(plan, work / f"episode-{result.episodes}", expected, rng, result, kills, max_delay)
        result.episodes += 1
    return result


def _episode(plan, work, expected, rng, result: SoakResult, kills: int, max_delay: float):
    """One run to the end: launch, maybe kill, resume, ..., then check the final history."""
    work.mkdir(parents=True, exist_ok=True)
    log, launches = work / "log.jsonl", 0
    while True:
        proc = _launch(plan, work, len(expected), resume=launches > 0)
        launches += 1
        result.launches += 1
        killed = False
        if result.kills < kills:
            try:
                proc.wait(timeout=rng.uniform(0.5, max_delay))
            except subprocess.TimeoutExpired:
                _kill_job(proc)
                result.kills += 1
                killed = True
        else:
            proc.wait(timeout=600)
        records = _log_records(log)  # read before the next launch trims the lost attempts
        for record in records:
            _check_attempt(record, expected)
        if killed:
            continue
        if proc.returncode != 0:
            tail = (work / "out.txt").read_text(errors="replace")[-3000:]
            raise AssertionError(f"a run that was not killed failed:\n{tail}")
        _check_history(records, expected)
        result.steps += len(records)
        result.samples += sum(len(ids) for r in records for ids in r["sample_ids"])
        return


def _check_attempt(record: dict, expected: list[list[list[int]]]) -> None:
    step = record["step"]
    if record["sample_ids"] != expected[step]:
        raise AssertionError(f"step {step} drew samples other than the plan's")


def _check_history(history: list[dict], expected: list[list[list[int]]]) -> None:
    steps = [r["step"] for r in history]
    if steps != list(range(len(expected))):
        raise AssertionError(f"the final model's steps are {steps}, not 0..{len(expected) - 1}")
    trained = Counter(i for r in history for ids in r["sample_ids"] for i in ids)
    planned = Counter(i for step in expected for ids in step for i in ids)
    if trained != planned:
        lost, extra = planned - trained, trained - planned
        raise AssertionError(
            f"{sum(lost.values())} planned samples lost, {sum(extra.values())} extra"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--plan", type=Path, required=True, help="a plan made with --dp-size 2")
    p.add_argument("--work", type=Path, default=REPO / "build" / "soak")
    p.add_argument("--kills", type=int, default=200)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.work.exists():
        import shutil

        shutil.rmtree(args.work)
    started = time.perf_counter()
    r = soak(args.plan, args.work, kills=args.kills, steps=args.steps, seed=args.seed)
    print(
        f"soak: {r.kills} kill points survived over {r.launches} launches in {r.episodes} "
        f"episodes; every step attempt, lost ones included, drew the plan's samples; the final "
        f"histories hold {r.steps} steps and {r.samples} samples, exactly the plan's; "
        f"{time.perf_counter() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
