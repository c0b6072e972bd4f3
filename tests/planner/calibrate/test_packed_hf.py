"""The Hugging Face model of `mds calibrate --hf-config`: samples run as their own causal
sequences, so a packed micro-batch gives each sample what it gives alone."""

from __future__ import annotations

import json

import pytest

from mds.errors import ConfigError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from mds.planner.calibrate.packed_hf import build_hf_model, hf_describe  # noqa: E402

CONFIG = {"model_type": "qwen2", "num_hidden_layers": 1, "hidden_size": 32,
          "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 64,
          "vocab_size": 50, "max_position_embeddings": 256}  # fmt: skip


def test_packed_equals_samples_alone(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    model, vocab = build_hf_model(tmp_path, seed=1)
    assert vocab == 50
    ids = torch.randint(0, vocab, (1, 12), generator=torch.Generator().manual_seed(0))
    packed = model(ids, torch.tensor([0, 5, 12], dtype=torch.int32))
    alone = model(ids[:, :5], torch.tensor([0, 5])) + model(ids[:, 5:], torch.tensor([0, 7]))
    torch.testing.assert_close(packed, alone)
    packed.backward()
    assert "qwen2: layers 1, hidden 32, heads 2 (kv 1)" in hf_describe(tmp_path / "config.json")


def test_unreadable_config(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="--hf-config .*config.json"):
        build_hf_model(tmp_path / "config.json")
