"""A real VLM on mds micro-batches: a tiny randomly initialised Qwen2-VL takes a vision plan's
packed micro-batches (input_ids [1, T], pixel_values, image_grid_thw, labels, packed M-RoPE
position ids) for forward and backward on CPU; packing changes no sample's logits."""

from __future__ import annotations

import pytest
import torch
from vision_builders import GEOMETRY, VOCAB, char_tokens, vision_world

from mds.executor import PlanExecutor
from mds.executor.integrations.hf import hf_batch, qwen2_vl_position_ids

transformers = pytest.importorskip("transformers")
pytest.importorskip("PIL")


def tiny_qwen2_vl(seed: int = 0):
    """2 text layers, hidden 64; a 2-block ViT of width 32; the test geometry's patch, merge,
    temporal and token ids."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    g = GEOMETRY
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=4096,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2, 3, 3],
            },
            bos_token_id=None,
            eos_token_id=None,
        ),
        vision_config=dict(
            depth=2,
            embed_dim=32,
            hidden_size=64,
            num_heads=2,
            mlp_ratio=2,
            patch_size=g.patch_size,
            spatial_merge_size=g.merge_size,
            temporal_patch_size=g.temporal_patch_size,
        ),
        image_token_id=g.image_token_id,
        vision_start_token_id=g.vision_start_id,
        vision_end_token_id=g.vision_end_id,
        video_token_id=VOCAB - 1,
    )
    torch.manual_seed(seed)
    return Qwen2VLForConditionalGeneration(config).eval()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return vision_world(tmp_path_factory.mktemp("qwen"))


def test_forward_backward_on_mds_micro_batches(world):
    model = tiny_qwen2_vl()
    images = 0
    with PlanExecutor(world["plan"], 0, tokenize=char_tokens) as ex:
        for mb in ex:
            batch = hf_batch(mb, flash_attn_kwargs=False, vision=ex.vision)
            assert batch["input_ids"].shape == (1, len(mb["input_ids"]))
            assert batch["position_ids"].shape[:2] == (4, 1)
            model.zero_grad()
            out = model(**batch)
            assert torch.isfinite(out.loss)
            out.loss.backward()
            visual = model.model.visual.patch_embed.proj.weight.grad
            if len(mb["image_grid_thw"]):
                images += len(mb["image_grid_thw"])
                assert visual is not None and visual.abs().sum() > 0
    assert images > 3


def test_packed_positions_are_the_models(world):
    """Per sample, the M-RoPE rows are what the model's get_rope_index computes for that
    sample alone, and the packed micro-batch's logits are each sample's logits alone."""
    model = tiny_qwen2_vl(seed=1)
    checked = 0
    with PlanExecutor(world["plan"], 1, tokenize=char_tokens) as ex:
        for mb in ex:
            cu = mb["cu_seqlens"].tolist()
            if len(cu) < 3 or not len(mb["image_grid_thw"]):
                continue
            batch = hf_batch(mb, flash_attn_kwargs=False, vision=ex.vision)
            pos = qwen2_vl_position_ids(mb, GEOMETRY.merge_size, GEOMETRY.image_token_id)
            assert torch.equal(pos, batch["position_ids"])
            with torch.no_grad():
                packed = model(**batch).logits[0]
            first_patch = mb["image_cu_seqlens"].tolist()
            for k in range(len(cu) - 1):
                lo, hi = cu[k], cu[k + 1]
                ids = mb["input_ids"][lo:hi].unsqueeze(0)
                mine = (mb["image_sample"] == k).nonzero().flatten().tolist()
                kwargs = {}
                if mine:
                    a, b = first_patch[mine[0]], first_patch[mine[-1] + 1]
                    kwargs = {
                        "pixel_values": mb["pixel_values"][a:b],
                        "image_grid_thw": mb["image_grid_thw"][mine],
                    }
                    types = (ids == GEOMETRY.image_token_id).int()
                    want, _ = model.model.get_rope_index(ids, types, kwargs["image_grid_thw"])
                    assert torch.equal(pos[1:, :, lo:hi], want)
                    kwargs["mm_token_type_ids"] = types
                else:
                    assert torch.equal(pos[1:, 0, lo:hi], torch.arange(hi - lo).expand(3, -1))
                with torch.no_grad():
                    alone = model(input_ids=ids, **kwargs).logits[0]
                torch.testing.assert_close(packed[lo:hi], alone, atol=2e-5, rtol=1e-4)
                checked += 1
    assert checked >= 4
