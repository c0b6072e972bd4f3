"""The FLOP model of `[cost] model` / `[cost] hf_config` (src/mds/core/flops.py)."""

from __future__ import annotations

import json

import pytest

from mds.core.flops import ModelShape, hf_config_shape
from mds.errors import ConfigError
from mds.planner.plan.config import parse_cost

LLAMA_TINY = {"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 688, "mlp": "gated",
              "vocab": 32000}  # fmt: skip


def test_formula_gqa_gated_by_hand():
    # head_dim 64: q = 256, kv = 2 x 64 = 128. Per layer, forward:
    #   projections 2*256*(256 + 2*128 + 256) = 393,216; MLP 2*3*256*688 = 1,056,768
    # 2 layers: 2,899,968; LM head 2*256*32000 = 16,384,000; forward a = 19,283,968.
    # Attention 2*2*256 / 2 (causal) = 512 per layer, 1,024 for two. Training: x 3.
    cost = parse_cost({"model": LLAMA_TINY}, "")
    assert (cost.a, cost.b) == (57_851_904.0, 3_072.0)
    assert cost.origin == "model" and cost.d == 0.0
    assert cost.describe()["model"] == {**LLAMA_TINY, "causal": True}


def test_formula_gpt2_small_by_hand_equals_narayanan():
    # 12 layers, h = 768, plain MLP 3072: per layer 2*768*(4*768) + 2*2*768*3072 = 14,155,776;
    # x 12 = 169,869,312; LM head 2*768*50257 = 77,194,752; forward a = 247,064,064.
    shape = ModelShape(layers=12, hidden=768, heads=12, ffn=3072, mlp="plain", vocab=50257)
    assert shape.coefficients() == (741_192_192.0, 55_296.0)
    # ... which is Narayanan et al.'s 72*l*h^2 + 6*h*V and 6*l*h (causal).
    legacy = parse_cost({"model": {"layers": 12, "hidden": 768, "vocab": 50257}}, "")
    assert (legacy.a, legacy.b) == shape.coefficients()
    assert "model" not in legacy.describe()  # existing configs keep their plan bytes
    full = ModelShape(layers=12, hidden=768, heads=12, ffn=3072, vocab=50257, causal=False)
    assert full.coefficients()[1] == 2 * 55_296.0


def test_head_dim_apart_from_hidden():
    # Gemma-style: 8 heads of 256 on hidden 2048 equal q = 2048; 4 heads of 256: q = 1024.
    shape = ModelShape(layers=1, hidden=2048, heads=4, kv_heads=1, head_dim=256, ffn=1, mlp="plain")
    assert (shape.q_dim, shape.kv_dim) == (1024, 256)
    a, b = shape.forward_flops()
    assert a == 2 * 2048 * (1024 + 512 + 1024) + 2 * 2 * 2048 * 1
    assert b == 2 * 2 * 1024 / 2


def write(tmp_path, data, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


LLAMA_HF = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 688,
    "vocab_size": 32000,
    "hidden_act": "silu",
}
FAMILIES = {
    "llama": LLAMA_HF,
    "mistral": {**LLAMA_HF, "model_type": "mistral", "sliding_window": 4096},
    "qwen2": {**LLAMA_HF, "model_type": "qwen2", "use_sliding_window": False},
    "gpt_neox": {
        "model_type": "gpt_neox",
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "intermediate_size": 1024,
        "vocab_size": 32000,
        "rotary_pct": 0.25,
    },
    "gpt2": {
        "model_type": "gpt2",
        "n_layer": 2,
        "n_embd": 256,
        "n_head": 4,
        "n_inner": None,
        "vocab_size": 32000,
    },  # fmt: skip
}
SHAPES = {
    "llama": LLAMA_TINY,
    "mistral": LLAMA_TINY,
    "qwen2": LLAMA_TINY,
    "gpt_neox": {
        "layers": 2,
        "hidden": 256,
        "heads": 4,
        "ffn": 1024,
        "mlp": "plain",
        "vocab": 32000,
    },
    "gpt2": {"layers": 2, "hidden": 256, "heads": 4, "ffn": 1024, "mlp": "plain", "vocab": 32000},
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hf_config_families(tmp_path, family):
    write(tmp_path, FAMILIES[family])
    cost = parse_cost({"hf_config": "config.json"}, "cfg.toml: ", tmp_path)
    by_shape = parse_cost({"model": SHAPES[family]}, "")
    assert (cost.a, cost.b) == (by_shape.a, by_shape.b)
    assert cost.origin == "hf_config"
    described = cost.describe()["model"]
    assert described["family"] == family
    assert {k: v for k, v in described.items() if k != "family"} == {**by_shape.describe()["model"]}


def test_hf_config_directory_and_relative_to_cost_file(tmp_path):
    model = tmp_path / "models" / "tiny"
    model.mkdir(parents=True)
    write(model, LLAMA_HF)
    assert hf_config_shape(model, "").layers == 2
    (tmp_path / "cost.toml").write_text('[cost]\nhf_config = "models/tiny"\n')
    cost = parse_cost({"file": "cost.toml"}, "cfg.toml: ", tmp_path)
    assert cost.origin == "hf_config"


def test_hf_config_vision_language_text_config(tmp_path):
    write(tmp_path, {"model_type": "qwen2", "text_config": {k: v for k, v in LLAMA_HF.items()
                                                             if k != "model_type"}})  # fmt: skip
    assert hf_config_shape(tmp_path / "config.json", "").kv_heads == 2


def test_hf_config_from_transformers_classes(tmp_path):
    transformers = pytest.importorskip("transformers")
    for cls, mlp in (
        (transformers.LlamaConfig, "gated"),
        (transformers.MistralConfig, "gated"),
        (transformers.Qwen2Config, "gated"),
        (transformers.GPT2Config, "plain"),
        (transformers.GPTNeoXConfig, "plain"),
    ):
        cfg = cls()
        path = tmp_path / f"{cfg.model_type}.json"
        path.write_text(cfg.to_json_string())
        shape = hf_config_shape(path, "")
        assert shape.mlp == mlp
        assert shape.layers == getattr(cfg, "num_hidden_layers", getattr(cfg, "n_layer", None))
        assert shape.vocab == cfg.vocab_size


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({**LLAMA_HF, "num_hidden_layers": None}, "`num_hidden_layers` is required"),
        ({k: v for k, v in LLAMA_HF.items() if k != "hidden_size"}, "`hidden_size` is required"),
        ({**LLAMA_HF, "intermediate_size": "big"}, "`intermediate_size` must be an integer"),
        ({**LLAMA_HF, "model_type": "bert"}, "model_type 'bert' is not one this reader knows"),
        ({**LLAMA_HF, "model_type": "mixtral", "num_local_experts": 8}, "`num_local_experts`"),
        ({"hidden_size": 3}, "no `model_type`"),
        ({**LLAMA_HF, "num_key_value_heads": 3}, "must be a multiple of `kv_heads`"),
        (
            {"model_type": "gpt2", "n_layer": 2, "n_head": 4, "vocab_size": 9},
            "`n_embd` is required",
        ),
    ],
)
def test_hf_config_errors_name_file_and_key(tmp_path, data, message):
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        parse_cost({"hf_config": "config.json"}, "cfg.toml: ", tmp_path)
    assert message in str(err.value)
    assert str(err.value).startswith("cfg.toml: [cost]: `hf_config` ")
    assert str(path) in str(err.value)


def test_hf_config_not_json(tmp_path):
    (tmp_path / "config.json").write_text("{nope")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        parse_cost({"hf_config": "config.json"}, "", tmp_path)
