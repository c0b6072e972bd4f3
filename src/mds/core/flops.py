"""Training FLOPs of a decoder-only transformer per sample: the `[cost] model` and
`[cost] hf_config` forms of docs/config.md.

A sample of L tokens costs a*L + b*L^2 FLOPs (forward + backward), with a and b from the
model's shape (`ModelShape.coefficients`). The per-sample constant `d` of the cost model has
no FLOP counterpart here (embedding look-ups, norms, activations, softmax and rotary
embeddings are element-wise, O(L*h), and left out), so it stays 0.

`hf_config_shape` reads a Hugging Face `config.json` from a local path (never downloaded)
into the same shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mds.errors import ConfigError

__all__ = [
    "GATED_FAMILIES",
    "MLP_KINDS",
    "PLAIN_FAMILIES",
    "ModelShape",
    "hf_config_shape",
]

MLP_KINDS = ("gated", "plain")
# model_type of a Hugging Face config -> its MLP: gated (gate, up and down projections,
# SwiGLU/GeGLU) or plain (up and down).
GATED_FAMILIES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "olmo",
    "olmo2",
    "granite",
    "phi3",
    "internlm2",
)
PLAIN_FAMILIES = ("gpt2", "gpt_neox", "gptj", "gpt_bigcode", "starcoder2", "phi")
# Keys of a mixture-of-experts config: the FLOPs per token depend on the experts it routes to.
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer: `layers` blocks of width `hidden`, attention with `heads`
    query heads and `kv_heads` key/value heads (GQA; = heads without GQA) of `head_dim`
    (hidden / heads unless given), an MLP of `ffn` (intermediate size) that is `gated` (3
    matrices) or `plain` (2), an LM head over `vocab` (0: none counted), causal or full
    attention. Without `heads`/`ffn` it is the shape of Narayanan et al.'s formula:
    q, k, v of width hidden, a plain MLP of 4 x hidden."""

    layers: int
    hidden: int
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    ffn: int | None = None
    mlp: str = "plain"
    vocab: int = 0
    causal: bool = True
    family: str | None = None  # a Hugging Face config's model_type, for messages

    @property
    def q_dim(self) -> int:
        """Width of all query heads together (= hidden unless `head_dim` says otherwise)."""
        if self.heads is None:
            return self.hidden
        return self.heads * (self.head_dim or self.hidden // self.heads)

    @property
    def kv_dim(self) -> int:
        """Width of all key (or value) heads together."""
        if self.heads is None:
            return self.hidden
        return (self.kv_heads or self.heads) * (self.head_dim or self.hidden // self.heads)

    @property
    def ffn_size(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden

    def forward_flops(self) -> tuple[float, float]:
        """(per token, per token^2) FLOPs of one forward pass over a sequence of L tokens.

        A multiply-add is 2 FLOPs; h = hidden, q = heads x head_dim, kv = kv_heads x
        head_dim, f = ffn. Per layer:

        - Q, K, V, O projections: 2*L*h*(q + 2*kv + q) (the K and V projections are
          kv wide under grouped-query attention; O maps q back to h);
        - MLP: 2*L*3*h*f gated (gate, up, down: Llama, Mistral, Qwen2) or 2*L*2*h*f plain
          (up, down: GPT-2, GPT-NeoX);
        - attention scores Q K^T and their product with V: 2*L^2*q each, 2*2*L^2*q in all,
          halved for causal attention (a kernel that skips masked blocks computes half the
          L x L matrix).

        Once per sequence: the LM head, 2*L*h*vocab. Element-wise work (norms,
        activations, softmax, rotary embeddings, residuals) is O(L*h) per layer against
        O(L*h^2) for the matrices and is left out. With heads unset (q = kv = h) and f =
        4h plain, this is Narayanan et al. 2021 ("Efficient Large-Scale Language Model
        Training on GPU Clusters Using Megatron-LM", appendix): 24*L*h^2 + 4*L^2*h per layer."""
        h, q, kv = float(self.hidden), float(self.q_dim), float(self.kv_dim)
        matrices = 3.0 if self.mlp == "gated" else 2.0
        per_layer = 2.0 * h * (q + 2.0 * kv + q) + 2.0 * matrices * h * self.ffn_size
        attention = 2.0 * 2.0 * q * (0.5 if self.causal else 1.0)
        a = self.layers * per_layer + 2.0 * h * self.vocab
        return a, self.layers * attention

    def coefficients(self) -> tuple[float, float]:
        """(a, b) of the training cost a*L + b*L^2: 3 x the forward FLOPs (the backward pass
        computes the gradients of both the inputs and the weights of every matrix product,
        twice the forward's work)."""
        a, b = self.forward_flops()
        return 3.0 * a, 3.0 * b

    def describe(self) -> dict[str, Any]:
        """The shape as stored in a plan's `cost.model` (keys that are set only)."""
        out: dict[str, Any] = {"layers": self.layers, "hidden": self.hidden}
        for key in ("heads", "kv_heads", "head_dim", "ffn"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.ffn is not None:
            out["mlp"] = self.mlp
        out["vocab"] = self.vocab
        out["causal"] = self.causal
        if self.family is not None:
            out["family"] = self.family
        return out

    def text(self) -> str:
        """One line for messages: `llama: layers 2, hidden 256, heads 4 (kv 2), ffn 688 gated,
        vocab 32000`."""
        parts = [f"layers {self.layers}", f"hidden {self.hidden}"]
        if self.heads is not None:
            kv = f" (kv {self.kv_heads})" if self.kv_heads not in (None, self.heads) else ""
            parts.append(f"heads {self.heads}{kv}")
        parts.append(f"ffn {self.ffn_size} {self.mlp}")
        parts.append(f"vocab {self.vocab}")
        if not self.causal:
            parts.append("full attention")
        text = ", ".join(parts)
        return f"{self.family}: {text}" if self.family else text


def check_shape(shape: ModelShape, where: str) -> ModelShape:
    """Consistency of the head counts: kv_heads needs heads and divides it; hidden divides
    into heads unless head_dim is given."""
    if shape.kv_heads is not None and shape.heads is None:
        raise ConfigError(f"{where}`kv_heads` needs `heads`")
    if shape.head_dim is not None and shape.heads is None:
        raise ConfigError(f"{where}`head_dim` needs `heads`")
    if shape.heads is not None:
        if shape.head_dim is None and shape.hidden % shape.heads:
            raise ConfigError(
                f"{where}`hidden` ({shape.hidden}) must be a multiple of `heads` "
                f"({shape.heads}), or give `head_dim`"
            )
        if shape.kv_heads is not None and shape.heads % shape.kv_heads:
            raise ConfigError(
                f"{where}`heads` ({shape.heads}) must be a multiple of `kv_heads` "
                f"({shape.kv_heads})"
            )
    if shape.mlp not in MLP_KINDS:
        raise ConfigError(f"{where}`mlp` must be one of gated, plain, got {shape.mlp!r}")
    return shape


def _positive(config: dict[str, Any], key: str, where: str, default: Any = None) -> Any:
    value = config.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}`{key}` must be an integer >= 1, got {value!r}")
    return value


def _required(config: dict[str, Any], key: str, where: str) -> int:
    value = _positive(config, key, where)
    if value is None:
        raise ConfigError(f"{where}`{key}` is required for model_type {config['model_type']!r}")
    return value


def hf_config_shape(path: Path, where: str) -> ModelShape:
    """The ModelShape of a Hugging Face `config.json` (or a directory holding one), read
    from the local file system.

    Llama-style families (GATED_FAMILIES): num_hidden_layers, hidden_size,
    num_attention_heads, num_key_value_heads (default: the attention heads), head_dim
    (optional), intermediate_size, vocab_size; gated MLP. GPT-NeoX, StarCoder2, Phi:
    the same keys, plain MLP. GPT-2 and GPT-J: n_layer, n_embd, n_head, n_inner (None: 4 x
    n_embd), vocab_size; plain MLP. GPT-BigCode: GPT-2's keys, one KV head with
    multi_query. A config with `text_config` (a vision-language model) is read from it."""
    if path.is_dir():
        path = path / "config.json"
    fwhere = f"{where}`hf_config`: "
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{fwhere}cannot read {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{fwhere}{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{fwhere}{path} is not a JSON object")
    if isinstance(data.get("text_config"), dict) and "num_hidden_layers" not in data:
        data = {"model_type": data.get("model_type"), **data["text_config"]}
    where = f"{where}`hf_config` {path}: "
    family = data.get("model_type")
    if not isinstance(family, str):
        raise ConfigError(f"{where}no `model_type` (is this a Hugging Face config.json?)")
    moe = [k for k in MOE_KEYS if data.get(k)]
    if moe:
        raise ConfigError(
            f"{where}`{moe[0]}`: mixture-of-experts models are not supported; give "
            "`[cost] model = {...}` with the FLOPs of the experts a token is routed to as `ffn`"
        )
    if family in ("gpt2", "gptj", "gpt_bigcode"):
        hidden = _required(data, "n_embd", where)
        heads = _required(data, "n_head", where)
        kv = 1 if family == "gpt_bigcode" and data.get("multi_query", True) else None
        shape = ModelShape(
            layers=_required(data, "n_layer", where),
            hidden=hidden,
            heads=heads,
            kv_heads=kv,
            ffn=_positive(data, "n_inner", where) or 4 * hidden,
            mlp="plain",
            vocab=_required(data, "vocab_size", where),
            family=family,
        )
    elif family in GATED_FAMILIES or family in PLAIN_FAMILIES:
        heads = _required(data, "num_attention_heads", where)
        shape = ModelShape(
            layers=_required(data, "num_hidden_layers", where),
            hidden=_required(data, "hidden_size", where),
            heads=heads,
            kv_heads=_positive(data, "num_key_value_heads", where),
            head_dim=_positive(data, "head_dim", where),
            ffn=_required(data, "intermediate_size", where),
            mlp="gated" if family in GATED_FAMILIES else "plain",
            vocab=_required(data, "vocab_size", where),
            family=family,
        )
    else:
        known = ", ".join((*GATED_FAMILIES, *PLAIN_FAMILIES))
        raise ConfigError(
            f"{where}model_type {family!r} is not one this reader knows ({known}); give "
            "`[cost] model = { layers, hidden, heads, kv_heads, ffn, mlp, vocab }` instead"
        )
    return check_shape(shape, where)
