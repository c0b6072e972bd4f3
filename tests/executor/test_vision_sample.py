"""The image-text sample data end to end: `sample_data/vlm.toml` indexed and planned by the
planner (WebDataset captions, HF-layout Parquet charts, `[vision]`), replayed by the
executor: micro-batches consistent with the geometry, the same after seek(k) and through
DataLoader workers, and a tiny Qwen2-VL's forward and backward on them."""

from __future__ import annotations

import argparse
import importlib.util
import sys

import pytest
import torch
from plan_builders import REPO

from mds.executor import PlanExecutor

pytest.importorskip("PIL")
CONFIG = REPO / "sample_data" / "vlm.toml"
EXAMPLE = REPO / "examples" / "train_vlm.py"


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    from mds.planner.index.build import build_index
    from mds.planner.index.config import load_config
    from mds.planner.plan.build import build_plan, with_overrides
    from mds.planner.plan.config import load_plan_config

    out = tmp_path_factory.mktemp("vlm")
    build_index(load_config(CONFIG), out / "index", workers=1)
    path = out / "plan.mds"
    build_plan(with_overrides(load_plan_config(CONFIG), index=out / "index"), path, workers=1)
    return path


def digest(mb) -> bytes:
    return b"".join(
        v.numpy().tobytes() if torch.is_tensor(v) else repr(v).encode()
        for _k, v in sorted(mb.items())
    )


@pytest.mark.parametrize("rank", [0, 1])
def test_replay_resume_and_workers(plan, rank):
    with PlanExecutor(plan, rank) as ex:
        g = ex.vision
        assert g is not None and ex.source_names == ["captions", "charts"]
        whole = []
        images = 0
        for mb in ex:
            grids = mb["image_grid_thw"]
            tokens = (grids[:, 1] * grids[:, 2] // g.merge_size**2).sum()
            assert int((mb["input_ids"] == g.image_token_id).sum()) == int(tokens)
            assert int((mb["input_ids"] == g.vision_start_id).sum()) == len(grids)
            assert mb["image_cu_seqlens"].tolist()[-1] == len(mb["pixel_values"])
            assert mb["pixel_values"].shape[1] == g.patch_dim
            image_token = torch.isin(
                mb["input_ids"],
                torch.tensor([g.image_token_id, g.vision_start_id, g.vision_end_id]),
            )
            assert (mb["labels"][image_token] == -100).all()
            assert all(0 <= i < len(mb["sample_id"]) for i in mb["image_sample"].tolist())
            images += len(grids)
            whole.append(digest(mb))
    assert images > 10
    for k in (3, 10):
        with PlanExecutor(plan, rank, read_ahead=0) as ex:
            ex.seek(*divmod(k, ex.micro_batches))
            assert [digest(mb) for mb in ex] == whole[k:]
    with PlanExecutor(plan, rank) as ex:
        assert [digest(mb) for mb in ex.dataloader(num_workers=2)] == whole


def test_qwen2_vl_trains_on_the_sample_plan(plan):
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("train_vlm", EXAMPLE)
    train_vlm = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("train_vlm", train_vlm)
    spec.loader.exec_module(train_vlm)
    vocab = train_vlm.TextTokenizer(train_vlm.DEFAULT_TOKENIZER).vocab_size()
    torch.manual_seed(0)
    with PlanExecutor(plan, 0) as ex:
        model = train_vlm.tiny_qwen2_vl(vocab, ex.vision, argparse.Namespace(layers=2, hidden=64))
        for _, mb in zip(range(4), ex, strict=False):
            batch = train_vlm.model_inputs(mb, ex, vocab)
            model.zero_grad()
            out = model(**batch)
            assert torch.isfinite(out.loss)
            out.loss.backward()
            grad = model.model.visual.patch_embed.proj.weight.grad
            assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
