"""PlanDataModule in Lightning's own fit loop: a tiny model trains a few steps on a plan of
sample_data/; resuming from a mid-run checkpoint gives the uninterrupted run's batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pl = pytest.importorskip("lightning.pytorch")

import torch  # noqa: E402
from executor_builders import open_executor, text_tokenizers  # noqa: E402

from mds.executor.integrations.lightning import PlanDataModule  # noqa: E402

STEPS, AT = 4, 2


class TinyLM(pl.LightningModule):
    """An embedding and a linear head over packed token ids; records what it trained on."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(4096, 8)
        self.head = torch.nn.Linear(8, 4096)
        self.seen: list[tuple[int, int, list[int]]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append((batch["step"], batch["micro_batch"], batch["sample_id"].tolist()))
        ids = batch["input_ids"]
        logits = self.head(self.embed(ids[:-1]))
        return torch.nn.functional.cross_entropy(logits, ids[1:])

    def configure_optimizers(self):
        self.stepping = self.trainer.estimated_stepping_batches  # what LR schedulers size by
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(plan, root, ckpt_path=None, **trainer_kwargs):
    dm = PlanDataModule(plan, tokenize=text_tokenizers(), estimated="fit")
    model = TinyLM()
    trainer_kwargs.setdefault("max_steps", STEPS)
    trainer_kwargs.setdefault("enable_progress_bar", False)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        accumulate_grad_batches=dm.micro_batches,
        default_root_dir=root,
        logger=False,
        enable_model_summary=False,
        **trainer_kwargs,
    )
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return model.seen, trainer


@pytest.fixture
def plan(small_plan):
    return small_plan


def test_resume_from_a_mid_run_checkpoint_gives_the_same_batches(plan, tmp_path):
    every = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=AT, save_top_k=-1, filename="{step}"
    )
    seen, trainer = fit(plan, tmp_path / "a", callbacks=[every])
    with open_executor(plan, 0) as ex:
        expected = [(b["step"], b["micro_batch"], b["sample_id"].tolist()) for b in ex]
    assert seen == expected  # every micro-batch of the plan, in order, once
    assert trainer.global_step == STEPS

    resumed, trainer = fit(plan, tmp_path / "b", ckpt_path=tmp_path / "ckpt" / f"step={AT}.ckpt")
    assert resumed == expected[AT * 2 :]
    assert trainer.global_step == STEPS


def test_a_checkpoint_resumes_on_a_plan_re_planned_at_its_step(plan, small_replan, tmp_path):
    """Switching plans mid-run: the old plan's checkpoint at step AT starts the new plan."""
    every = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=AT, save_top_k=-1, filename="{step}"
    )
    fit(plan, tmp_path / "a", callbacks=[every])
    resumed, trainer = fit(
        small_replan, tmp_path / "b", ckpt_path=tmp_path / "ckpt" / f"step={AT}.ckpt"
    )
    with open_executor(small_replan, 0) as ex:
        assert ex.first_step == AT
        expected = [(b["step"], b["micro_batch"], b["sample_id"].tolist()) for b in ex]
    assert resumed == expected and trainer.global_step == STEPS


def test_len_is_the_ranks_micro_batches_and_the_rank_is_the_trainers(plan, tmp_path):
    dm = PlanDataModule(plan, tokenize=text_tokenizers(), estimated="fit")
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, logger=False, max_steps=STEPS + 5, accumulate_grad_batches=2
    )
    dm.trainer = trainer
    dm.setup("fit")
    assert len(dm.train_dataloader()) == STEPS * dm.micro_batches  # the plan ends first
    assert (dm.executor.dp_rank, dm.executor.dp_size) == (trainer.global_rank, 1)
    assert trainer.max_epochs == 1  # one pass over the plan, not Lightning's unbounded -1
    dm.teardown("fit")
    # a run that stops before the plan ends counts to where it stops
    dm = PlanDataModule(plan, tokenize=text_tokenizers(), estimated="fit")
    dm.trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, max_steps=1)
    dm.setup("fit")
    assert len(dm.train_dataloader()) == 1
    dm.teardown("fit")


class TqdmShown(pl.callbacks.TQDMProgressBar):
    """The default progress bar as the user sees it: epoch text, count and total per batch."""

    def __init__(self):
        super().__init__()
        self.shown: list[tuple[str, int, int]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        bar = self.train_progress_bar
        self.shown.append((bar.desc.rstrip(": "), bar.n, bar.total))


class RichShown(pl.callbacks.RichProgressBar):
    """The rich progress bar, which writes the epoch as `Epoch 0/<max_epochs - 1>`."""

    def __init__(self):
        super().__init__()
        self.shown: list[tuple[str, int, int]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        task = self.progress.tasks[self.train_progress_bar_id]
        self.shown.append((task.description.strip(), int(task.completed), int(task.total)))


@pytest.mark.parametrize(
    ("bar", "max_steps", "epoch"),
    [(TqdmShown, STEPS, "Epoch 0"), (TqdmShown, STEPS - 1, "Epoch 0"), (RichShown, STEPS, "Epoch 0/0")],
)
def test_the_progress_bar_counts_to_where_the_run_stops(plan, tmp_path, bar, max_steps, epoch):
    bar = bar()
    seen, trainer = fit(
        plan, tmp_path, max_steps=max_steps, enable_progress_bar=True, callbacks=[bar]
    )
    batches = max_steps * 2  # micro-batches per step in small_plan
    assert len(seen) == batches and trainer.global_step == max_steps
    assert trainer.max_epochs == 1 and trainer.lightning_module.stepping == max_steps
    assert [n for _desc, n, _total in bar.shown] == list(range(1, batches + 1))
    assert {total for _desc, _n, total in bar.shown} == {batches}
    assert {desc for desc, _n, _total in bar.shown} == {epoch}


WORKER = Path(__file__).with_name("lightning_ddp_worker.py")


@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_gloo_available(), reason="needs gloo")
def test_two_ddp_ranks_each_train_their_own_slice(small_plan_dp2, tmp_path):
    """Lightning's DDP under torchrun: the DP rank is the trainer's global rank."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += [str(WORKER), str(small_plan_dp2), str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(2):
        record = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        with open_executor(small_plan_dp2, rank) as ex:
            expected = [[b["step"], b["micro_batch"], b["sample_id"].tolist()] for b in ex]
        assert record["seen"] == expected[: 2 * ex.micro_batches]


def test_a_run_longer_than_one_pass_over_the_plan_is_refused(plan, tmp_path):
    from mds.executor import ConfigError

    dm = PlanDataModule(plan, tokenize=text_tokenizers(), estimated="fit")
    dm.trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False)  # 1000 epochs
    with pytest.raises(ConfigError, match="max_epochs=1"):
        dm.setup("fit")
    # one epoch is the plan: its steps size the schedule, and all of them are trained
    seen, trainer = fit(plan, tmp_path, max_steps=-1, max_epochs=1)
    assert trainer.lightning_module.stepping == trainer.global_step == STEPS
    assert len(seen) == STEPS * dm.micro_batches


class _Dim:
    def __init__(self, rank, size):
        self.rank, self.n = rank, size

    def get_local_rank(self):
        return self.rank

    def size(self):
        return self.n


class _Mesh:
    """A DeviceMesh as ModelParallelStrategy builds it, as far as dp_coordinates reads it."""

    mesh_dim_names = ("data_parallel", "tensor_parallel")

    def __getitem__(self, name):
        assert name == "data_parallel"
        return _Dim(1, 2)


def test_the_dp_rank_is_the_meshs_data_parallel_dimension_when_there_is_one():
    from types import SimpleNamespace

    from mds.executor.integrations.lightning import dp_coordinates

    meshed = SimpleNamespace(strategy=SimpleNamespace(device_mesh=_Mesh()), global_rank=3)
    assert dp_coordinates(meshed) == (1, 2)
    plain = SimpleNamespace(strategy=SimpleNamespace(), global_rank=3, world_size=4)
    assert dp_coordinates(plain) == (3, 4)
    assert dp_coordinates(plain, tp=2) == (1, 2)
