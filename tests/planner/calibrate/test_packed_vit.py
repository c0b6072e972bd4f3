"""The built-in encoder for calibration: packed images attend only to themselves, fully."""

from __future__ import annotations

import pytest
import torch

from mds.errors import ConfigError
from mds.planner.calibrate.packed_vit import VitShape, build_packed_vit

SHAPE = VitShape(layers=2, hidden=16, heads=2, patch_size=2, temporal_patch_size=2)


def test_images_in_a_packed_row_are_independent():
    assert SHAPE.patch_dim == 3 * 2 * 2 * 2
    model = build_packed_vit(SHAPE, seed=3)
    gen = torch.Generator().manual_seed(0)
    pixels = torch.randn((12, SHAPE.patch_dim), generator=gen)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    out = model(pixels, cu)
    assert out.shape == (12, 16)
    other = pixels.clone()
    other[5:] += 1.0  # change only the second image
    changed = model(other, cu)
    assert torch.equal(changed[:5], out[:5])
    assert not torch.allclose(changed[5:], out[5:])
    later = pixels.clone()
    later[4] += 1.0  # full attention: the first image's last patch reaches its first
    assert not torch.allclose(model(later, cu)[0], out[0])
    alone = model(pixels[5:], torch.tensor([0, 7], dtype=torch.int32))
    assert torch.allclose(alone, out[5:], atol=1e-5)


def test_seeded_and_checked():
    a, b = build_packed_vit(SHAPE, seed=1), build_packed_vit(SHAPE, seed=1)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
    assert VitShape().patch_dim == 1176  # Qwen2-VL's rows: 3 x 2 x 14 x 14
    assert "patch = 2 x 14 x 14" in VitShape().describe()
    with pytest.raises(
        ConfigError, match="--hidden \\(10\\) must be a multiple of --heads \\(4\\)"
    ):
        build_packed_vit(VitShape(layers=1, hidden=10, heads=4))
