"""PlanIterator with Megatron's real model-parallel state (megatron-core, gloo on CPU): the
DP rank is Megatron's, batches are Megatron's packed (THD) layout, and resuming at the
checkpoint's iteration continues with the uninterrupted run's batches.

Megatron's own schedule (`get_forward_backward_func()`) allocates on CUDA, so the training
loop here is a stand-in that calls `forward_step_func(data_iterator, model)` once per
micro-batch the way Megatron's no-pipelining schedule does."""

from __future__ import annotations

import socket
import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # no Transformer Engine or Apex on CPU
    parallel_state = pytest.importorskip("megatron.core.parallel_state")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from executor_builders import open_executor, text_tokenizers  # noqa: E402

from mds.executor.integrations.megatron_lm import PlanIterator  # noqa: E402

STEPS, AT = 4, 2


@pytest.fixture(scope="module")
def megatron_world():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


class TinyGPT(torch.nn.Module):
    """Stands in for GPTModel: per-token losses from tokens, positions and labels."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(2048, 8)
        self.head = torch.nn.Linear(8, 2048)

    def forward(self, tokens, position_ids, attention_mask, labels, packed_seq_params=None):
        logits = self.head(self.embed(tokens))
        return torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), labels.flatten(), reduction="none"
        ).view_as(labels)


def train(plan, iteration, seen):
    """Megatron's loop, reduced: per iteration, forward_step once per micro-batch."""
    data = PlanIterator(plan, iteration=iteration, tokenize=text_tokenizers(), estimated="fit")
    model = TinyGPT()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def forward_step(data_iterator, model):
        batch = next(data_iterator)
        seen.append((batch["step"], batch["micro_batch"], batch["sample_id"].tolist()))
        losses = model(
            batch["tokens"],
            batch["position_ids"],
            batch["attention_mask"],
            labels=batch["labels"],
            packed_seq_params=batch["packed_seq_params"],
        )
        mask = batch["loss_mask"]
        return (losses * mask).sum() / mask.sum().clamp(min=1)

    for _ in range(iteration, STEPS):
        for _ in range(data.micro_batches):
            (forward_step(data, model) / data.micro_batches).backward()
        optimizer.step()
        optimizer.zero_grad()
    data.close()


def test_resume_at_the_checkpoint_iteration_gives_the_same_batches(small_plan, megatron_world):
    full: list = []
    train(small_plan, 0, full)
    with open_executor(small_plan, 0) as ex:
        expected = [(b["step"], b["micro_batch"], b["sample_id"].tolist()) for b in ex]
    assert full == expected
    resumed: list = []
    train(small_plan, AT, resumed)
    assert resumed == expected[AT * 2 :]


def test_batches_are_megatrons_packed_layout(small_plan, megatron_world):
    data = PlanIterator(small_plan, tokenize=text_tokenizers(), estimated="fit")
    assert (data.executor.dp_rank, data.executor.dp_size) == (
        parallel_state.get_data_parallel_rank(),
        parallel_state.get_data_parallel_world_size(),
    )
    batch = next(data)
    data.close()
    tokens, labels, mask = batch["tokens"][0], batch["labels"][0], batch["loss_mask"][0]
    params = batch["packed_seq_params"]
    assert params.qkv_format == "thd" and params.cu_seqlens_q.dtype == torch.int32
    cu = params.cu_seqlens_q.tolist()
    assert len(cu) > 2 and cu[-1] == tokens.numel() == labels.numel()
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        assert labels[a : b - 1].tolist() == tokens[a + 1 : b].tolist()  # next token, same sample
        assert mask[a : b - 1].eq(1).all() and mask[b - 1] == 0
        assert batch["position_ids"][0, a:b].tolist() == list(range(b - a))
        assert params.max_seqlen_q >= b - a
