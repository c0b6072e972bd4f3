"""Train a tiny GPT on an mds plan: the executor side of mds, end to end, on CPU.

What this demonstrates:

- **Each rank replays its own slice of the plan.** `PlanExecutor.from_env` reads torchrun's
  RANK and WORLD_SIZE and yields this DP rank's packed micro-batches in plan order. No
  sampler, no shuffling, no per-source readers in the training loop.
- **Packed micro-batches with sample boundaries.** A micro-batch is one row of concatenated
  samples; `cu_seqlens` marks where each starts. Attention is block-diagonal causal (a token
  sees only earlier tokens of its own sample) and the next-token loss never crosses from one
  sample into the next.
- **Gradient accumulation over the plan's micro-batches.** Every step runs forward/backward
  on each of the step's micro-batches, then one all-reduce of the gradients and one
  optimizer step. The loss is the mean over every target token of the step on all ranks,
  so ranks with more tokens weigh more, exactly as one big batch would.
- **Resume is a seek.** The checkpoint holds the model, the optimizer and the executor's
  `state_dict()` (plan id and the next step). `--resume` continues with bit-identical
  batches, and on CPU with fixed seeds and deterministic kernels, bit-identical losses.

Run it on the sample data (two ranks, so plan for dp_size 2):

    mds index sample_data/mds.toml -o build/index
    mds plan sample_data/mds.toml --index build/index -o build/plan-dp2.mds --dp-size 2
    torchrun --standalone --nproc_per_node=2 examples/train_tiny.py \\
        --plan build/plan-dp2.mds --steps 4 --checkpoint build/ckpt
    torchrun --standalone --nproc_per_node=2 examples/train_tiny.py \\
        --plan build/plan-dp2.mds --steps 8 --checkpoint build/ckpt --resume

Without torchrun (no RANK in the environment) it runs as rank 0 of a world of 1, which
needs a plan made with `--dp-size 1`.

The sample config's `code` source has estimated lengths (bytes/4), so the executor runs
with `estimated="fit"` (each such sample is cut to its planned length); text sources are
tokenized with `--tokenizer` (default: the sample data's word-level tokenizer.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mds.executor import MdsError, PlanExecutor

# torch.distributed.nn.functional binds `group.WORLD` as the default argument of its
# functions when it is first imported. Imported after init_process_group (here
# use_deterministic_algorithms imports it, through torch._inductor), those defaults hold the
# gloo group past destroy_process_group: its threads keep running and are only torn down
# during interpreter shutdown. Imported now, before any group exists, the defaults are None
# and destroy_process_group ends the group's threads.
if dist.is_available():
    import torch.distributed.nn  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TOKENIZER = REPO / "sample_data" / "tokenizer.json"
CHECKPOINT_NAME = "checkpoint.pt"

# --- the model --------------------------------------------------------------------------


def block_causal_mask(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """The [T, T] boolean mask of a packed row: True where token i may attend to token j,
    i.e. j <= i and both in the same sample (a block-diagonal of causal triangles)."""
    lengths = cu_seqlens.diff().long()
    total = int(cu_seqlens[-1])
    sample = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    pos = torch.arange(total)
    return (sample[:, None] == sample[None, :]) & (pos[None, :] <= pos[:, None])


def packed_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, mode: str
) -> torch.Tensor:
    """Block-diagonal causal attention over a packed row; q, k, v are [heads, T, head_dim].

    "mask" applies `block_causal_mask` to the whole row. "blocks" computes the same thing
    one diagonal block (one sample) at a time, with a causal mask inside the block: the
    off-diagonal blocks are fully masked, so skipping them changes nothing but the cost
    (sum of L_i^2 instead of T^2, the difference between seconds and a minute for a
    micro-batch of a few long samples on CPU).
    """
    if mode == "mask":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=block_causal_mask(cu_seqlens))
    bounds = cu_seqlens.tolist()
    outs = [
        F.scaled_dot_product_attention(q[:, a:b], k[:, a:b], v[:, a:b], is_causal=True)
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    return torch.cat(outs, dim=1)


def sinusoidal(position_ids: torch.Tensor, dim: int) -> torch.Tensor:
    """Fixed sine/cosine position encodings of `position_ids` (which restart per sample)."""
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    angle = position_ids.float()[:, None] * freq[None, :]
    return torch.cat([angle.sin(), angle.cos()], dim=1)


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, attention: str):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(t, 3, self.heads, d // self.heads).permute(1, 2, 0, 3)
        y = packed_attention(q, k, v, cu_seqlens, self.attention)
        x = x + self.proj(y.permute(1, 0, 2).reshape(t, d))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A pre-norm decoder over one packed row of tokens; the output head is tied to the
    token embedding."""

    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, attention: str):
        super().__init__()
        if d_model % heads or (d_model // heads) % 2:
            raise ValueError(f"d_model {d_model} must split into {heads} heads of even size")
        self.d_model = d_model
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, attention) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor
    ) -> torch.Tensor:
        x = self.embed(input_ids) + sinusoidal(position_ids, self.d_model)
        for block in self.blocks:
            x = block(x, cu_seqlens)
        return self.ln(x) @ self.embed.weight.T


def next_token_targets(mb: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, labels) of the next-token loss inside each sample: every token but the
    last of its sample predicts the token after it."""
    ids, cu = mb["input_ids"], mb["cu_seqlens"].long()
    keep = torch.ones(len(ids), dtype=torch.bool)
    keep[cu[1:] - 1] = False  # a sample's last token has no target in its sample
    where = torch.nonzero(keep).squeeze(1)
    return where, ids[where + 1]


# --- distributed helpers (no-ops in a world of one) ---------------------------------------


def all_reduce_(tensor: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_gather(obj: Any) -> list[Any]:
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_reduce_grads(model: nn.Module) -> None:
    """Sum every gradient over the ranks, in one flat buffer (a parameter without a grad,
    e.g. after only empty micro-batches, contributes zeros).

    Done by hand rather than with DistributedDataParallel: the losses are already divided
    by the step's token count over all ranks, so the gradients must be summed, not
    averaged, and a rank can skip the forward pass of an empty micro-batch."""
    params = list(model.parameters())
    flat = torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
    )
    all_reduce_(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n


# --- checkpoints ---------------------------------------------------------------------------


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write `state` to path atomically: a temporary file, fsync, then os.replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    # weights_only: tensors, numbers, strings and containers only, nothing executed.
    return torch.load(path, map_location="cpu", weights_only=True)


# --- the run -------------------------------------------------------------------------------


class TextTokenizer:
    """str -> token ids with a tokenizer.json; picklable (it reloads from its path), so it
    also works in DataLoader workers started with `spawn`."""

    def __init__(self, path: Path):
        self.path = str(path)
        self._tok = None

    def __call__(self, text: str) -> list[int]:
        if self._tok is None:
            from tokenizers import Tokenizer

            self._tok = Tokenizer.from_file(self.path)
        return self._tok.encode(text, add_special_tokens=False).ids

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_tok": None}

    def vocab_size(self) -> int:
        self("")
        return self._tok.get_vocab_size()


def digest(mbs: list[dict[str, Any]]) -> str:
    """A hash of one rank's input of one step: every micro-batch's tokens and boundaries."""
    h = hashlib.blake2b(digest_size=16)
    for mb in mbs:
        for key in ("input_ids", "cu_seqlens"):
            arr = mb[key].numpy()
            h.update(f"{key}{arr.dtype}{arr.shape}".encode())
            h.update(arr.tobytes())
    return h.hexdigest()


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warm-up, then constant: a pure function of the step, so nothing to checkpoint."""
    return args.lr * min(1.0, (step + 1) / args.warmup)


def steps_of(batches: Iterator[dict[str, Any]], micro_batches: int):
    """Group the plan's micro-batches into steps (the plan yields them step by step)."""
    while True:
        mbs = []
        for _ in range(micro_batches):
            mb = next(batches, None)
            if mb is None:
                return
            mbs.append(mb)
        yield mbs


def check_batches(mbs: list[dict[str, Any]], step: int, vocab: int) -> None:
    for mb in mbs:
        if mb["step"] != step:
            raise RuntimeError(f"expected a micro-batch of step {step}, got step {mb['step']}")
        if len(mb["input_ids"]) and int(mb["input_ids"].max()) >= vocab:
            raise RuntimeError(
                f"step {step}: token id {int(mb['input_ids'].max())} is outside the "
                f"tokenizer's vocabulary of {vocab}; pass the tokenizer the data was made with"
            )


def train_step(model, optimizer, mbs, step, args) -> tuple[float, int, int]:
    """Forward/backward on every micro-batch of the step, then one optimizer update.
    Returns (loss of the step over all ranks, target tokens, samples of this rank)."""
    targets = [next_token_targets(mb) for mb in mbs]
    local = torch.tensor([float(sum(len(w) for w, _ in targets))], dtype=torch.float64)
    count = float(all_reduce_(local).item())  # target tokens of the step on all ranks
    optimizer.zero_grad(set_to_none=True)
    loss_sum = torch.zeros(1, dtype=torch.float64)
    for mb, (where, labels) in zip(mbs, targets, strict=True):
        if len(where) == 0:  # an empty micro-batch (or one of 1-token samples): no targets
            continue
        logits = model(mb["input_ids"], mb["position_ids"], mb["cu_seqlens"])
        loss = F.cross_entropy(logits[where], labels, reduction="sum")
        (loss / count).backward()
        loss_sum += loss.detach().double()
    all_reduce_grads(model)
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step, args)
    optimizer.step()
    all_reduce_(loss_sum)
    samples = sum(len(mb["sample_id"]) for mb in mbs)
    return float(loss_sum.item() / max(count, 1.0)), int(count), samples


def build_executor(args: argparse.Namespace) -> PlanExecutor:
    """This rank's executor. Text sources are tokenized with --tokenizer; estimated lengths
    (the sample's `code` source) are cut to what the plan packed."""
    kwargs: dict[str, Any] = dict(tokenize=TextTokenizer(args.tokenizer), estimated="fit")
    return PlanExecutor.from_env(args.plan, **kwargs)  # without torchrun: rank 0 of 1


def run(args: argparse.Namespace) -> int:
    """Join the process group (when launched by torchrun), train, leave it."""
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
    ckpt = Path(args.checkpoint) / CHECKPOINT_NAME if args.checkpoint else None
    if ckpt is not None and ckpt.exists() and not args.resume:
        raise UsageError(f"{ckpt} exists; pass --resume to continue from it, or remove it")
    with build_executor(args) as ex:
        state = None
        if args.resume and ckpt is not None and ckpt.exists():
            state = load_checkpoint(ckpt)
            ex.load_state_dict(state["data"])  # refuses the state of another plan
        train_from(ex, state, ckpt, args, rank, world)


def train_from(ex: PlanExecutor, state, ckpt: Path | None, args, rank: int, world: int) -> None:
    """Train from the executor's position; `state` is the checkpoint resumed from, if any."""
    say = print if rank == 0 else (lambda *a, **k: None)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    vocab = TextTokenizer(args.tokenizer).vocab_size()
    model = TinyGPT(vocab, args.d_model, args.layers, args.heads, args.attention)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay
    )
    start = ex.position[0]
    stop = min(args.steps, ex.steps) if args.steps is not None else ex.steps
    say(
        f"plan {ex.plan_id}: {ex.steps} steps x {ex.dp_size} DP ranks x {ex.micro_batches} "
        f"micro-batches; world {world}; {sum(p.numel() for p in model.parameters()):,} "
        f"parameters, vocab {vocab}"
    )
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        say(f"resumed from {ckpt} at step {start}")
    elif args.resume:
        say(f"no checkpoint in {args.checkpoint} yet: starting at step 0")
    if start >= stop:
        say(f"nothing to do: the run is at step {start}, --steps is {stop}")

    def save(step_done: int) -> None:
        if ckpt is not None and rank == 0:
            save_checkpoint(
                ckpt,
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "data": ex.state_dict(),  # the position of the next micro-batch
                    "step": step_done,
                    "world_size": world,
                },
            )

    if args.log_json and rank == 0:
        trim_log(Path(args.log_json), start)
    log = open(args.log_json, "a") if args.log_json and rank == 0 else None  # noqa: SIM115
    source = ex.dataloader(num_workers=args.workers) if args.workers > 0 else ex
    batches = iter(source)
    step = start
    try:
        for mbs in steps_of(batches, ex.micro_batches) if start < stop else ():
            check_batches(mbs, step, vocab)
            t0 = time.perf_counter()
            loss, tokens, samples = train_step(model, optimizer, mbs, step, args)
            inputs, per_rank = all_gather(digest(mbs)), all_gather(samples)
            ids = all_gather([int(i) for mb in mbs for i in mb["sample_id"]])
            say(
                f"step {step + 1:4d}/{stop}  loss {loss:.4f}  target tokens {tokens:6d}  "
                f"samples {sum(per_rank):3d}  {time.perf_counter() - t0:.2f}s"
            )
            if log is not None:  # before the checkpoint: a logged step may be redone, not lost
                record = {
                    "step": step,
                    "loss": loss,
                    "tokens": tokens,
                    "samples": per_rank,
                    "sample_ids": ids,  # per rank, in plan order
                    "inputs": inputs,
                    "lr": lr_at(step, args),
                }
                log.write(json.dumps(record) + "\n")
                log.flush()
            step += 1
            if step == stop:
                break
            if step % args.save_every == 0:
                save(step)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # stops DataLoader workers
        if log is not None:
            log.close()
    if ckpt is not None and (step > start or not ckpt.exists()):
        save(step)
        say(f"checkpoint at step {step}: {ckpt}")


def trim_log(path: Path, start: int) -> None:
    """Keep the log lines of steps before `start`: the steps a resumed model has trained on.
    Later lines belong to work lost with the process (a killed run may end mid-line)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # the torn last line of a killed run
        if record["step"] < start:
            kept.append(line + "\n")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)


class UsageError(Exception):
    """A problem with the command line or the checkpoint directory: one line, exit 2."""


EPILOG = """\
example (two ranks: the plan must be made with --dp-size 2):
  torchrun --standalone --nproc_per_node=2 examples/train_tiny.py \\
      --plan build/plan-dp2.mds --steps 4 --checkpoint build/ckpt
  torchrun --standalone --nproc_per_node=2 examples/train_tiny.py \\
      --plan build/plan-dp2.mds --steps 8 --checkpoint build/ckpt --resume
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="train_tiny.py",
        description="Train a tiny GPT on CPU from an mds plan: one DP rank per process\n"
        "(torchrun, gloo), gradient accumulation over the plan's micro-batches, exact resume.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    data = p.add_argument_group("data")
    data.add_argument("--plan", required=True, metavar="FILE", help="plan for dp_size = world")
    data.add_argument(
        "--tokenizer",
        metavar="FILE",
        default=str(DEFAULT_TOKENIZER),
        help="tokenizer.json for text sources (default: sample_data/tokenizer.json)",
    )
    data.add_argument(
        "--workers", type=int, default=0, metavar="K", help="DataLoader workers per rank (0)"
    )
    run = p.add_argument_group("run")
    run.add_argument("--steps", type=int, metavar="N", help="stop after step N (default: all)")
    run.add_argument("--checkpoint", metavar="DIR", help="save model, optimizer and data state")
    run.add_argument(
        "--save-every", type=int, default=2, metavar="N", help="checkpoint every N steps (2)"
    )
    run.add_argument("--resume", action="store_true", help="continue from --checkpoint if any")
    run.add_argument("--log-json", metavar="PATH", help="rank 0 appends a JSON line per step")
    run.add_argument("--seed", type=int, metavar="N", default=0, help="seed of everything (0)")
    run.add_argument(
        "--threads", type=int, metavar="N", default=1, help="torch threads per rank (1)"
    )
    model = p.add_argument_group("model and optimizer")
    model.add_argument("--layers", type=int, metavar="N", default=2, help="decoder blocks (2)")
    model.add_argument("--d-model", type=int, metavar="N", default=64, help="width (64)")
    model.add_argument("--heads", type=int, metavar="N", default=2, help="attention heads (2)")
    model.add_argument(
        "--attention",
        choices=("blocks", "mask"),
        default="blocks",
        help="blocks (default): causal attention one sample at a time; mask: one [T, T] "
        "block-diagonal causal mask over the row (same result, far slower on long rows)",
    )
    model.add_argument(
        "--lr", type=float, metavar="X", default=3e-3, help="AdamW learning rate (3e-3)"
    )
    model.add_argument(
        "--warmup", type=int, metavar="N", default=4, help="linear warm-up steps (4)"
    )
    model.add_argument("--weight-decay", type=float, metavar="X", default=0.01, help="AdamW (0.01)")
    model.add_argument(
        "--clip", type=float, metavar="X", default=1.0, help="gradient norm clip (1.0)"
    )
    args = p.parse_args(argv)
    for name in ("steps", "save_every", "warmup", "threads", "layers", "heads", "d_model"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.workers < 0:
        p.error("--workers must be >= 0")
    if args.resume and not args.checkpoint:
        p.error("--resume needs --checkpoint DIR")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except (MdsError, UsageError) as exc:
        rank = os.environ.get("RANK")
        where = f" (rank {rank})" if rank is not None else ""
        print(f"train_tiny{where}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
