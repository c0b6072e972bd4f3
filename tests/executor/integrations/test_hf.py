"""PlanTrainer in Hugging Face Trainer's own loop: a tiny randomly initialized Llama trains a
few steps on a plan of sample_data/; resuming from a checkpoint folder gives the
uninterrupted run's batches. And hf_batch packs samples the way HF models read them."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from executor_builders import open_executor, text_tokenizers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments  # noqa: E402

from mds.executor.integrations import hf  # noqa: E402
from mds.executor.integrations.hf import PlanTrainer, hf_batch  # noqa: E402

STEPS, AT = 4, 2


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=2048,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=8192,
    )
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config)


@pytest.fixture
def plan(small_plan):
    return small_plan


def train(plan, out, seen, resume=None, max_steps=STEPS):
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=max_steps,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=2,
        save_steps=AT,
        learning_rate=1e-3,
        use_cpu=True,
        report_to=[],
        logging_steps=1000,
        disable_tqdm=True,
    )
    trainer = PlanTrainer(
        model=tiny_llama(),
        args=args,
        plan=plan,
        executor_kwargs={"tokenize": text_tokenizers(), "estimated": "fit"},
    )
    collate = trainer.plan_batches.collate

    def recording(mb):
        seen.append((mb["step"], mb["micro_batch"], mb["sample_id"].tolist()))
        return collate(mb)

    trainer.plan_batches.collate = recording
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_resume_from_a_checkpoint_folder_gives_the_same_batches(plan, tmp_path):
    seen: list = []
    trainer = train(plan, tmp_path / "out", seen)
    assert trainer.state.global_step == STEPS
    with open_executor(plan, 0) as ex:
        expected = [(b["step"], b["micro_batch"], b["sample_id"].tolist()) for b in ex]
    assert seen == expected
    checkpoint = tmp_path / "out" / f"checkpoint-{AT}"
    assert (checkpoint / hf.STATE_FILE).is_file()

    resumed: list = []
    trainer = train(plan, tmp_path / "out", resumed, resume=str(checkpoint))
    assert resumed == expected[AT * 2 :]
    assert trainer.state.global_step == STEPS


def test_a_checkpoint_resumes_on_a_plan_re_planned_at_its_step(plan, small_replan, tmp_path):
    """Switching plans mid-run: the old plan's checkpoint at step AT starts the new plan."""
    train(plan, tmp_path / "out", [])
    resumed: list = []
    checkpoint = tmp_path / "out" / f"checkpoint-{AT}"
    trainer = train(small_replan, tmp_path / "out", resumed, resume=str(checkpoint))
    with open_executor(small_replan, 0) as ex:
        assert ex.first_step == AT
        expected = [(b["step"], b["micro_batch"], b["sample_id"].tolist()) for b in ex]
    assert resumed == expected and trainer.state.global_step == STEPS


def test_without_max_steps_the_schedule_is_the_plans_length(plan, tmp_path):
    """len() of the loader is the rank's micro-batches: the Trainer sizes max_steps and the
    LR schedule from it (one optimizer step per plan step) and trains the whole plan."""
    seen: list = []
    trainer = train(plan, tmp_path / "out", seen, max_steps=-1)
    assert trainer.state.max_steps == trainer.state.global_step == STEPS
    assert len(seen) == STEPS * 2


def test_packed_batch_equals_the_samples_run_one_by_one(plan):
    """SDPA with position restarts is block-diagonal: packed logits are each sample's own."""
    model = tiny_llama().eval()
    with open_executor(plan, 0) as ex:
        mb = next(iter(ex))
    batch = hf_batch(mb)
    assert batch["input_ids"].shape == batch["labels"].shape == (1, mb["input_ids"].numel())
    cu = mb["cu_seqlens"].tolist()
    assert len(cu) > 2  # at least two samples packed
    assert batch["labels"][0, cu[:-1]].eq(-100).all()
    with torch.no_grad():
        batch.pop("labels")
        packed = model(**batch).logits[0]
        for a, b in zip(cu[:-1], cu[1:], strict=True):
            alone = model(input_ids=mb["input_ids"][a:b].unsqueeze(0)).logits[0]
            torch.testing.assert_close(packed[a:b], alone, rtol=1e-4, atol=1e-4)


def test_an_empty_micro_batch_is_one_ignored_token():
    empty = {
        "input_ids": torch.zeros(0, dtype=torch.int64),
        "position_ids": torch.zeros(0, dtype=torch.int64),
        "cu_seqlens": torch.zeros(1, dtype=torch.int32),
        "max_seqlen": 0,
    }
    batch = hf_batch(empty)
    assert batch["input_ids"].shape == (1, 1) and batch["labels"].tolist() == [[-100]]


class _Parallelism:
    def __init__(self, tp, cp):
        self.tp_size, self.cp_size = tp, cp


class _Accelerator:
    """accelerate's Accelerator, as far as dp_coordinates reads it."""

    def __init__(self, index, processes, parallelism=None):
        self.process_index, self.num_processes = index, processes
        self.parallelism_config = parallelism


def test_the_dp_rank_is_accelerates_process_index_without_tp_and_cp_peers():
    assert hf.dp_coordinates(_Accelerator(3, 4)) == (3, 4)
    # accelerate's mesh varies tp fastest, then cp, then the data-parallel dimensions
    tp2 = [hf.dp_coordinates(_Accelerator(i, 8, _Parallelism(2, 1))) for i in range(8)]
    assert tp2 == [(0, 4), (0, 4), (1, 4), (1, 4), (2, 4), (2, 4), (3, 4), (3, 4)]
    tp2cp2 = [hf.dp_coordinates(_Accelerator(i, 8, _Parallelism(2, 2)))[0] for i in range(8)]
    assert tp2cp2 == [0, 0, 0, 0, 1, 1, 1, 1]


def test_a_gradient_accumulation_other_than_the_plans_is_refused(plan, tmp_path):
    from mds.executor import ConfigError

    args = TrainingArguments(
        output_dir=str(tmp_path), gradient_accumulation_steps=3, use_cpu=True, report_to=[]
    )
    with pytest.raises(ConfigError, match="gradient_accumulation_steps=2"):
        PlanTrainer(model=tiny_llama(), args=args, plan=plan, executor_kwargs={"estimated": "fit"})
