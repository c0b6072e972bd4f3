"""A Hugging Face causal LM of a local `config.json`, for `mds calibrate --hf-config`.

The model is `transformers.AutoModelForCausalLM.from_config` (random weights, nothing
downloaded) with `attn_implementation="sdpa"`, wrapped in the calibration form
forward(input_ids [1, T], cu_seqlens [n + 1]): each sample of the packed row runs as its own
causal sequence (batch 1, its own positions from 0), one forward per sample, and the
scalar returned sums the samples' mean logits, so backward covers the whole micro-batch.

Why one forward per sample rather than the packed row: transformers 5.x does detect packed
rows from position_ids that restart per sample (masking_utils.find_packed_sequence_indices)
and masks each sample to itself, but with SDPA on CPU that mask is a dense T x T boolean,
so attention still computes the whole packed row: the cost then grows with the micro-batch's
T^2, not with each sample's L^2, which is not what a varlen kernel (flash-attn's, the
per-sample cost mds balances) does. Running samples one by one gives each its own L^2, as a
varlen kernel does, plus a per-sample overhead that the fit's `d` absorbs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mds.errors import ConfigError, install_hint

__all__ = ["build_hf_model", "hf_describe"]


def _load_config(path: Path) -> Any:
    try:
        from transformers import AutoConfig
    except ImportError:
        raise ConfigError(
            f"--hf-config needs transformers: {install_hint('hf')}"
        ) from None
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"--hf-config {path}: no such file")
    try:
        return AutoConfig.from_pretrained(str(path))
    except Exception as exc:  # transformers' own message names what is wrong
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"--hf-config {path}: transformers cannot read it: {text}") from None


def hf_describe(path: Path) -> str:
    """For the [cost] table's comment: `hf_config <path> (llama: layers 2, hidden 256, ...)`."""
    from mds.core.flops import hf_config_shape

    try:
        shape = hf_config_shape(path, "").text()
    except ConfigError:  # a family the FLOP model does not know can still be timed
        shape = "shape not read by the FLOP model"
    return f"hf_config {path} ({shape})"


def build_hf_model(path: Path, seed: int = 0) -> tuple[Any, int]:
    """(the wrapped module, its vocabulary size): random weights seeded by `seed`."""
    config = _load_config(path)
    import torch
    from torch import nn
    from transformers import AutoModelForCausalLM

    config.use_cache = False
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            inner = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
        except Exception as exc:
            text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"--hf-config {path}: cannot build the model: {text}") from None

    class PerSample(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
            cu = cu_seqlens.tolist()
            total = None
            for s, e in zip(cu[:-1], cu[1:], strict=True):
                out = self.inner(input_ids=input_ids[:, s:e], use_cache=False)
                part = out.logits.float().mean()
                total = part if total is None else total + part
            return total

    return PerSample(), int(config.vocab_size)
