"""Train a tiny GPT under online mixing: the weights of the sources follow the losses the
model reports, and a killed run resumes exactly (docs/online-mixing.md).

What this demonstrates:

- **Sources of clearly different difficulty.** `--make-data DIR` writes three synthetic
  token sources and their config: `repeat` (one short motif repeated: learnt in a few
  steps), `count` (arithmetic progressions mod the vocabulary: learnable from context, but
  slowly) and `random` (uniform tokens: its loss never falls below log(vocab)).
- **A policy that moves the mix.** The config's DoReMi policy compares each source's mean
  loss per token with a reference (`repeat` 0.5, `count` 1.0, `random` 5.0) and moves
  weight toward the sources whose loss is above it: away from `random` (nothing to learn,
  its reference is above any loss it can have) and, once the motif is learnt, from
  `repeat`, toward `count`.
- **The loop of an online run.** `OnlineExecutor` yields the rank's micro-batches window
  after window; after each step the loop reports the step's per-source loss sums and
  target tokens; at each window's end the executor reduces them over the ranks, rank 0
  records them in the signal log and plans the next segments in a subprocess while the
  model trains.
- **Exact resume.** The checkpoint holds the model, the optimizer and every rank's
  executor state (its position, the signal log and the rank's sums of the unfinished
  window); a run killed anywhere and resumed trains on the batches, and plans the
  segments, of the uninterrupted run (tests/examples/test_train_online.py).

Run it (two ranks; the model and the data are tiny, CPU only):

    python examples/train_online.py --make-data build/online-demo
    mds index build/online-demo/online.toml
    mds plan build/online-demo/online.toml -o build/online-demo/run/plan.mds
    torchrun --standalone --nproc_per_node=2 examples/train_online.py \\
        --plan build/online-demo/run/plan.mds --config build/online-demo/online.toml \\
        --checkpoint build/online-demo/ckpt
    mds inspect build/online-demo/run/plan.mds

The model, the packed attention and the distributed helpers are examples/train_tiny.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # train_tiny beside this file

from train_tiny import (  # noqa: E402
    TinyGPT,
    UsageError,
    all_gather,
    all_reduce_,
    all_reduce_grads,
    digest,
    load_checkpoint,
    next_token_targets,
    save_checkpoint,
    steps_of,
    trim_log,
)

from mds.executor import MdsError, OnlineExecutor  # noqa: E402

CHECKPOINT_NAME = "checkpoint.pt"
VOCAB = 64
SOURCES = ("repeat", "count", "random")
REFERENCE = {"repeat": 0.5, "count": 1.0, "random": 5.0}

# --- the synthetic data ----------------------------------------------------------------------


def sample_tokens(source: str, rng: random.Random) -> list[int]:
    """One sample of `source`: 24 to 40 token ids below VOCAB."""
    n = rng.randint(24, 40)
    if source == "repeat":
        motif = [3, 14, 15, 9, 26, 5]
        return [motif[i % len(motif)] for i in range(n)]
    if source == "count":
        start, stride = rng.randrange(VOCAB), rng.randint(1, 7)
        return [(start + i * stride) % VOCAB for i in range(n)]
    return [rng.randrange(VOCAB) for _ in range(n)]


def make_data(root: Path, samples: int = 400, steps: int = 24, window: int = 4) -> Path:
    """Write ROOT/<source>.jsonl and ROOT/online.toml (the index goes to ROOT/index);
    returns the config's path. Deterministic: the same files every time."""
    root.mkdir(parents=True, exist_ok=True)
    for i, source in enumerate(SOURCES):
        rng = random.Random(1000 + i)
        lines = [json.dumps({"tokens": sample_tokens(source, rng)}) for _ in range(samples)]
        (root / f"{source}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    tables = "".join(
        f'[[source]]\nname = "{s}"\npath = "{s}.jsonl"\ntokens = "tokens"\nweight = 1.0\n\n'
        for s in SOURCES
    )
    reference = ", ".join(f"{s} = {REFERENCE[s]}" for s in SOURCES)
    config = root / "online.toml"
    config.write_text(
        "# Synthetic sources of three difficulties, mixed online by DoReMi "
        "(examples/train_online.py)\n\n"
        '[index]\noutput = "index"\n\n'
        + tables
        + f"[train]\nsteps = {steps}\ndp_size = 2\nmicro_batches = 2\nsamples_per_step = 16\n"
        "max_tokens_per_micro_batch = 512\nseed = 1\n\n"
        f'[mixing]\nonline = {{ policy = "doremi", window = {window}, floor = 0.05, '
        f"step_size = 2.0, smoothing = 0.05, reference = {{ {reference} }} }}\n",
        encoding="utf-8",
    )
    return config


# --- training ----------------------------------------------------------------------------------


def source_losses(
    mb: dict[str, Any], where: torch.Tensor, losses: torch.Tensor, names: list[str]
) -> tuple[dict[str, float], dict[str, int]]:
    """Per source: the micro-batch's next-token losses summed, and how many targets."""
    cu = mb["cu_seqlens"].long()
    sample = torch.searchsorted(cu[1:], where, right=True)  # the sample of each target
    source = mb["source"].long()[sample]
    sums = torch.zeros(len(names), dtype=torch.float64).index_add_(0, source, losses.double())
    counts = torch.bincount(source, minlength=len(names))
    return (
        {names[i]: float(sums[i]) for i in range(len(names)) if counts[i]},
        {names[i]: int(counts[i]) for i in range(len(names)) if counts[i]},
    )


def train_step(model, optimizer, mbs, names, args) -> tuple[float, dict, dict]:
    """Forward/backward on every micro-batch of the step, then one optimizer update.
    Returns the step's loss over all ranks and this rank's per-source sums and counts."""
    targets = [next_token_targets(mb) for mb in mbs]
    local = torch.tensor([float(sum(len(w) for w, _ in targets))], dtype=torch.float64)
    count = float(all_reduce_(local).item())
    optimizer.zero_grad(set_to_none=True)
    loss_sum = torch.zeros(1, dtype=torch.float64)
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for mb, (where, labels) in zip(mbs, targets, strict=True):
        if len(where) == 0:
            continue
        logits = model(mb["input_ids"], mb["position_ids"], mb["cu_seqlens"])
        losses = F.cross_entropy(logits[where], labels, reduction="none")
        (losses.sum() / count).backward()
        loss_sum += losses.detach().sum().double()
        s, c = source_losses(mb, where, losses.detach(), names)
        for name in s:
            sums[name] = sums.get(name, 0.0) + s[name]
            counts[name] = counts.get(name, 0) + c[name]
    all_reduce_grads(model)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    for group in optimizer.param_groups:
        group["lr"] = args.lr
    optimizer.step()
    all_reduce_(loss_sum)
    return float(loss_sum.item() / max(count, 1.0)), sums, counts


def run(args: argparse.Namespace) -> int:
    launched = "RANK" in os.environ
    if launched:
        dist.init_process_group("gloo", timeout=timedelta(minutes=10))
    try:
        train(args, launched)
        if launched:
            dist.barrier()  # rank 0 may still be writing the checkpoint
    finally:
        if launched:
            dist.destroy_process_group()
    return 0


def train(args: argparse.Namespace, launched: bool) -> None:
    rank = dist.get_rank() if launched else 0
    world = dist.get_world_size() if launched else 1
    say = print if rank == 0 else (lambda *a, **k: None)
    ckpt = Path(args.checkpoint) / CHECKPOINT_NAME if args.checkpoint else None
    if ckpt is not None and ckpt.exists() and not args.resume:
        raise UsageError(f"{ckpt} exists; pass --resume to continue from it, or remove it")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    model = TinyGPT(VOCAB, 64, 2, 2, "blocks")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95))
    with OnlineExecutor(args.plan, rank, dp_size=world, config=args.config) as ex:
        state = load_checkpoint(ckpt) if args.resume and ckpt is not None and ckpt.exists() else None
        if state is not None:
            if len(state["data"]) != world:
                raise UsageError(f"{ckpt} holds {len(state['data'])} ranks' states, not {world}")
            ex.load_state_dict(state["data"][rank])  # collective: every rank calls it
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        start = ex.position[0]
        stop = min(args.steps, ex.steps) if args.steps is not None else ex.steps
        say(f"online run of plan {ex.plan_id}: {ex.steps} steps in {ex.windows} windows, "
            f"sources {', '.join(ex.source_names)}" + (f"; resumed at step {start}" if state else ""))  # fmt: skip
        names = ex.batch_source_names
        if args.log_json and rank == 0:
            trim_log(Path(args.log_json), start)
        log = open(args.log_json, "a") if args.log_json and rank == 0 else None  # noqa: SIM115

        def save(step_done: int) -> None:
            states = all_gather(ex.state_dict())  # every rank's: its partial window sums too
            if ckpt is not None and rank == 0:
                save_checkpoint(ckpt, {"model": model.state_dict(),
                                       "optimizer": optimizer.state_dict(),
                                       "data": states, "step": step_done})  # fmt: skip

        step = start
        try:
            for mbs in steps_of(iter(ex), ex.micro_batches) if start < stop else ():
                t0 = time.perf_counter()
                loss, sums, counts = train_step(model, optimizer, mbs, names, args)
                ex.report(step, sums, counts)  # before asking for the next micro-batch
                inputs = all_gather(digest(mbs))
                by_source = all_gather((sums, counts))
                weights = ex.weights
                say(f"step {step + 1:3d}/{stop}  window {ex.window}  loss {loss:.4f}  weights "
                    + " ".join(f"{n} {weights[n]:.3f}" for n in ex.source_names)
                    + f"  {time.perf_counter() - t0:.2f}s")  # fmt: skip
                if log is not None:
                    record = {"step": step, "window": ex.window, "loss": loss,
                              "inputs": inputs, "weights": weights,
                              "source_loss": _mean_losses(by_source)}  # fmt: skip
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                step += 1
                if step == stop < ex.steps:  # at the run's end, iteration closes the last window
                    break
                if step % args.save_every == 0:
                    save(step)
        finally:
            if log is not None:
                log.close()
        if ckpt is not None and step > start:
            save(step)
            say(f"checkpoint at step {step}: {ckpt}")


def _mean_losses(by_rank: list[tuple[dict[str, float], dict[str, int]]]) -> dict[str, float]:
    """The step's mean loss per target token per source, over the ranks."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for s, c in by_rank:
        for name in s:
            sums[name] = sums.get(name, 0.0) + s[name]
            counts[name] = counts.get(name, 0) + c[name]
    return {name: sums[name] / counts[name] for name in sorted(sums)}


EPILOG = """\
example (two ranks; the config plans for dp_size 2):
  python examples/train_online.py --make-data build/online-demo
  mds index build/online-demo/online.toml
  mds plan build/online-demo/online.toml -o build/online-demo/run/plan.mds
  torchrun --standalone --nproc_per_node=2 examples/train_online.py \\
      --plan build/online-demo/run/plan.mds --config build/online-demo/online.toml \\
      --checkpoint build/online-demo/ckpt
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="train_online.py",
        description="Train a tiny GPT on CPU under online mixing (mds.executor.OnlineExecutor):\n"
        "per-source losses reported every step, the mix re-planned every window, exact resume.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--make-data", metavar="DIR", help="write the synthetic sources and config, exit")
    p.add_argument("--plan", metavar="FILE", help="the run's first segment (mds plan CONFIG -o FILE)")
    p.add_argument("--config", metavar="FILE", help="the config it was planned from")
    p.add_argument("--steps", type=int, metavar="N", help="stop after step N (default: all)")
    p.add_argument("--checkpoint", metavar="DIR", help="save model, optimizer and data state")
    p.add_argument("--save-every", type=int, default=1, metavar="N", help="checkpoint every N steps (1)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint if any")
    p.add_argument("--log-json", metavar="PATH", help="rank 0 appends a JSON line per step")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of everything (0)")
    p.add_argument("--lr", type=float, default=1e-2, metavar="X", help="AdamW learning rate (1e-2)")
    args = p.parse_args(argv)
    if args.make_data is None and (args.plan is None or args.config is None):
        p.error("give --plan and --config (or --make-data DIR)")
    for name in ("steps", "save_every"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.resume and not args.checkpoint:
        p.error("--resume needs --checkpoint DIR")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.make_data is not None:
        print(f"wrote {make_data(Path(args.make_data))}")
        return 0
    try:
        return run(args)
    except (MdsError, UsageError) as exc:
        rank = os.environ.get("RANK")
        where = f" (rank {rank})" if rank is not None else ""
        print(f"train_online{where}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
