"""Train a tiny vision-language model (Qwen2-VL) on an mds plan of image-text data, on CPU.

What this demonstrates, beyond examples/train_tiny.py (whose structure it follows):

- **Images arrive decoded and patched.** A vision plan's micro-batch carries `pixel_values`
  (patch rows as Qwen2-VL's image processor makes them), `image_grid_thw`, and token ids
  with each image's placeholders where its text puts it; `labels` are -100 at image tokens.
  `hf_batch(mb, vision=ex.vision)` adds Qwen2-VL's packed position ids (text positions and
  M-RoPE), so samples packed in one row do not attend to each other.
- **Both parts of the model train.** The vision tower sees only the micro-batches that
  hold images; gradients are summed over ranks by hand (as in train_tiny.py), so a rank
  whose micro-batches hold no image contributes zeros instead of stalling DDP.
- **Resume is a seek.** The checkpoint holds the model, the optimizer and the executor's
  state; `--resume` continues with bit-identical batches, images included.

Run it on the image-text sample data (two ranks, so plan for dp_size 2):

    mds index sample_data/vlm.toml -o build/vlm-index
    mds plan sample_data/vlm.toml --index build/vlm-index -o build/vlm-plan.mds
    torchrun --standalone --nproc_per_node=2 examples/train_vlm.py \\
        --plan build/vlm-plan.mds --steps 2 --checkpoint build/vlm-ckpt
    torchrun --standalone --nproc_per_node=2 examples/train_vlm.py \\
        --plan build/vlm-plan.mds --steps 4 --checkpoint build/vlm-ckpt --resume

The tiny model's vocabulary is the tokenizer's plus three tokens, onto which the plan's
image, vision-start and vision-end ids (Qwen2-VL's, far beyond a small vocabulary) are
mapped at its input. Without torchrun it runs as rank 0 of a world of 1 (a dp_size-1 plan).
"""

from __future__ import annotations

import argparse
import hashlib
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

from mds.executor import MdsError, PlanExecutor

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
from train_tiny import (  # noqa: E402  (the shared helpers of the text example)
    TextTokenizer,
    UsageError,
    all_gather,
    all_reduce_,
    all_reduce_grads,
    load_checkpoint,
    save_checkpoint,
    steps_of,
)

DEFAULT_TOKENIZER = REPO / "sample_data" / "tokenizer.json"
CHECKPOINT_NAME = "checkpoint.pt"


def tiny_qwen2_vl(vocab: int, geometry, args: argparse.Namespace):
    """A randomly initialised Qwen2-VL: `args.layers` text layers of width `args.hidden`, a
    2-block ViT of width 32 with the plan's patch, merge and temporal sizes; the vision
    tokens are the vocabulary's last three."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    heads = 4
    half = args.hidden // heads // 2
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=vocab + 4,
            hidden_size=args.hidden,
            intermediate_size=2 * args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=heads,
            num_key_value_heads=2,
            max_position_embeddings=1 << 16,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [half - 2 * (half // 3), half // 3, half // 3],
            },
            bos_token_id=None,
            eos_token_id=None,
        ),
        vision_config=dict(
            depth=2,
            embed_dim=32,
            hidden_size=args.hidden,
            num_heads=2,
            mlp_ratio=2,
            patch_size=geometry.patch_size,
            spatial_merge_size=geometry.merge_size,
            temporal_patch_size=geometry.temporal_patch_size,
        ),
        image_token_id=vocab,
        vision_start_token_id=vocab + 1,
        vision_end_token_id=vocab + 2,
        video_token_id=vocab + 3,
    )
    return Qwen2VLForConditionalGeneration(config)


def model_inputs(mb: dict[str, Any], ex: PlanExecutor, vocab: int) -> dict[str, Any]:
    """The micro-batch as the model's keyword arguments, the plan's vision token ids mapped
    onto the tiny vocabulary's last three."""
    from mds.executor.integrations.hf import hf_batch

    g = ex.vision
    batch = hf_batch(mb, flash_attn_kwargs=False, vision=g)
    ids = batch["input_ids"].clone()
    for plan_id, mine in ((g.image_token_id, vocab), (g.vision_start_id, vocab + 1)):
        ids[batch["input_ids"] == plan_id] = mine
    if g.vision_end_id is not None:
        ids[batch["input_ids"] == g.vision_end_id] = vocab + 2
    batch["input_ids"] = ids
    if "pixel_values" in batch:
        batch["mm_token_type_ids"] = (ids == vocab).int()
    return batch


def digest(mbs: list[dict[str, Any]]) -> str:
    """A hash of one rank's input of one step: tokens, boundaries, labels and pixels."""
    h = hashlib.blake2b(digest_size=16)
    for mb in mbs:
        for key in ("input_ids", "cu_seqlens", "labels", "pixel_values", "image_grid_thw"):
            arr = mb[key].numpy()
            h.update(f"{key}{arr.dtype}{arr.shape}".encode())
            h.update(arr.tobytes())
    return h.hexdigest()


def train_step(model, optimizer, mbs, ex, vocab, args) -> tuple[float, int, int]:
    """Forward/backward on every micro-batch of the step, one optimizer update. The loss is
    the mean over the step's target tokens on all ranks (labels not -100, shifted)."""
    targets = [int((mb["labels"][1:] != -100).sum()) if len(mb["labels"]) else 0 for mb in mbs]
    count = float(all_reduce_(torch.tensor([float(sum(targets))], dtype=torch.float64)).item())
    optimizer.zero_grad(set_to_none=True)
    loss_sum = torch.zeros(1, dtype=torch.float64)
    for mb, n in zip(mbs, targets, strict=True):
        if n == 0:
            continue
        batch = model_inputs(mb, ex, vocab)
        labels = batch.pop("labels")[0]
        logits = model(**batch).logits[0]
        loss = F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="sum")
        (loss / count).backward()
        loss_sum += loss.detach().double()
    all_reduce_grads(model)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    all_reduce_(loss_sum)
    images = sum(len(mb["image_grid_thw"]) for mb in mbs)
    return float(loss_sum.item() / max(count, 1.0)), int(count), images


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
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    tokenize = TextTokenizer(args.tokenizer)
    vocab = tokenize.vocab_size()
    with PlanExecutor.from_env(args.plan, tokenize=tokenize) as ex:
        if ex.vision is None:
            raise UsageError(f"{args.plan} was planned without [vision]: use train_tiny.py")
        model = tiny_qwen2_vl(vocab, ex.vision, args)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95))
        if args.resume and ckpt is not None and ckpt.exists():
            state = load_checkpoint(ckpt)
            ex.load_state_dict(state["data"])  # refuses the state of another plan
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            say(f"resumed from {ckpt} at step {ex.position[0]}")
        start = ex.position[0]
        stop = min(args.steps, ex.steps) if args.steps is not None else ex.steps
        say(
            f"plan {ex.plan_id}: {ex.steps} steps x {ex.dp_size} DP ranks x {ex.micro_batches} "
            f"micro-batches; world {world}; {sum(p.numel() for p in model.parameters()):,} "
            "parameters"
        )

        def save(step_done: int) -> None:
            if ckpt is not None and rank == 0:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                save_checkpoint(ckpt, {**state, "data": ex.state_dict(), "step": step_done})

        log = open(args.log_json, "a") if args.log_json and rank == 0 else None  # noqa: SIM115
        source = ex.dataloader(num_workers=args.workers) if args.workers > 0 else ex
        batches = iter(source)
        step = start
        try:
            for mbs in steps_of(batches, ex.micro_batches) if start < stop else ():
                t0 = time.perf_counter()
                loss, tokens, images = train_step(model, optimizer, mbs, ex, vocab, args)
                inputs = all_gather(digest(mbs))
                per_rank = all_gather(images)
                say(
                    f"step {step + 1:3d}/{stop}  loss {loss:.4f}  target tokens {tokens:5d}  "
                    f"images {sum(per_rank):3d}  {time.perf_counter() - t0:.2f}s"
                )
                if log is not None:
                    record = {"step": step, "loss": loss, "images": per_rank, "inputs": inputs}
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
                close()
            if log is not None:
                log.close()
        if ckpt is not None and step > start:
            save(step)
            say(f"checkpoint at step {step}: {ckpt}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="train_vlm.py",
        description="Train a tiny Qwen2-VL on CPU from an mds plan of image-text data: one DP\n"
        "rank per process (torchrun, gloo), images decoded by the executor, exact resume.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--plan", required=True, metavar="FILE", help="a vision plan, dp_size = world")
    p.add_argument("--tokenizer", metavar="FILE", default=str(DEFAULT_TOKENIZER))
    p.add_argument("--workers", type=int, default=0, metavar="K", help="DataLoader workers (0)")
    p.add_argument("--steps", type=int, metavar="N", help="stop after step N (default: all)")
    p.add_argument("--checkpoint", metavar="DIR", help="save model, optimizer and data state")
    p.add_argument("--save-every", type=int, default=2, metavar="N", help="checkpoint every N (2)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint if any")
    p.add_argument("--log-json", metavar="PATH", help="rank 0 appends a JSON line per step")
    p.add_argument("--seed", type=int, default=0, metavar="N")
    p.add_argument("--threads", type=int, default=1, metavar="N", help="torch threads (1)")
    p.add_argument("--layers", type=int, default=2, metavar="N", help="text layers (2)")
    p.add_argument("--hidden", type=int, default=64, metavar="N", help="text width (64)")
    p.add_argument("--lr", type=float, default=3e-3, metavar="X", help="AdamW (3e-3)")
    args = p.parse_args(argv)
    for name in ("steps", "save_every", "threads", "layers"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.hidden % 8 or args.hidden < 32:
        p.error("--hidden must be a multiple of 8, at least 32")
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
        print(f"train_vlm{where}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
