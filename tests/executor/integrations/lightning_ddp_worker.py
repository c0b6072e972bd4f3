"""One rank of a two-process Lightning DDP run on CPU (gloo), started by torchrun: trains
PlanDataModule's batches and writes what this rank trained on to OUT/rank-<global rank>.json.

Usage: torchrun --standalone --nproc_per_node=2 lightning_ddp_worker.py PLAN OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from tokenizers import Tokenizer

from mds.executor.integrations.lightning import PlanDataModule

TOKENIZER = Path(__file__).resolve().parents[3] / "sample_data" / "tokenizer.json"
tokenizer = Tokenizer.from_file(str(TOKENIZER))


def tokenize(text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


class TinyLM(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(2048, 8)
        self.head = torch.nn.Linear(8, 2048)
        self.seen: list = []

    def training_step(self, batch, batch_idx):
        self.seen.append([batch["step"], batch["micro_batch"], batch["sample_id"].tolist()])
        ids = batch["input_ids"]
        return torch.nn.functional.cross_entropy(self.head(self.embed(ids[:-1])), ids[1:])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(plan: str, out: str) -> None:
    data = PlanDataModule(plan, tokenize=tokenize, estimated="fit")
    model = TinyLM()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=2,
        accumulate_grad_batches=data.micro_batches,
        default_root_dir=out,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(model, datamodule=data)
    record = {"global_rank": trainer.global_rank, "seen": model.seen}
    Path(out, f"rank-{trainer.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(*sys.argv[1:3])
