"""The built-in calibration model: packed samples attend only to themselves, causally."""

from __future__ import annotations

import pytest
import torch

from mds.errors import ConfigError
from mds.planner.calibrate.packed_gpt import GptShape, build_packed_gpt


def test_samples_in_a_packed_row_are_independent():
    model = build_packed_gpt(GptShape(layers=2, hidden=16, heads=2, vocab=32), seed=3)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 32, (1, 12), generator=gen)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    out = model(ids, cu)
    assert out.shape == (1, 12, 32)
    other = ids.clone()
    other[0, 5:] = (other[0, 5:] + 1) % 32  # change only the second sample
    assert torch.equal(model(other, cu)[0, :5], out[0, :5])
    later = ids.clone()
    later[0, 9] = (later[0, 9] + 1) % 32  # causal: positions before 9 do not see it
    assert torch.equal(model(later, cu)[0, :9], out[0, :9])
    alone = model(ids[:, 5:], torch.tensor([0, 7], dtype=torch.int32))
    assert torch.allclose(alone[0], out[0, 5:], atol=1e-5)


def test_seeded_and_checked():
    shape = GptShape(layers=1, hidden=8, heads=2, vocab=8)
    a, b = build_packed_gpt(shape, seed=1), build_packed_gpt(shape, seed=1)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
    with pytest.raises(
        ConfigError, match="--hidden \\(10\\) must be a multiple of --heads \\(4\\)"
    ):
        build_packed_gpt(GptShape(layers=1, hidden=10, heads=4, vocab=8))
