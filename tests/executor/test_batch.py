"""Packing: the micro-batch dict, its dtypes, and that docs/executor.md documents every key."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from mds.executor.batch import compact, expand, pack

DOC = (Path(__file__).resolve().parents[2] / "docs" / "executor.md").read_text(encoding="utf-8")


def _pack(lengths: list[int]) -> dict:
    tokens = [np.arange(n, dtype=np.int64) + 100 * i for i, n in enumerate(lengths)]
    n = len(lengths)
    return pack(
        tokens,
        source=np.arange(n) % 3,
        sample_id=np.arange(n) + 1000,
        row=np.arange(n) + 10,
        step=7,
        micro_batch=1,
    )


@given(st.lists(st.integers(0, 50), max_size=12))
def test_cu_seqlens_and_positions_describe_the_packed_samples(lengths):
    batch = _pack(lengths)
    cu = batch["cu_seqlens"]
    assert cu.dtype == torch.int32 and cu.tolist() == [0, *np.cumsum(lengths, dtype=int).tolist()]
    assert batch["input_ids"].dtype == torch.int64 and len(batch["input_ids"]) == sum(lengths)
    expected_pos = [p for n in lengths for p in range(n)]
    assert batch["position_ids"].tolist() == expected_pos
    assert batch["max_seqlen"] == max(lengths, default=0)
    for i, n in enumerate(lengths):
        sample = batch["input_ids"][cu[i] : cu[i + 1]]
        assert sample.tolist() == list(range(100 * i, 100 * i + n))
    assert batch["source"].dtype == torch.int32
    assert batch["sample_id"].dtype == torch.int64 and batch["row"].dtype == torch.int64
    assert (batch["step"], batch["micro_batch"]) == (7, 1)


def test_positions_are_fresh_arrays_whatever_the_counting_array_held():
    """Positions come from one counting array kept across micro-batches (grown as they
    grow); each micro-batch's are its own, so a trainer may write into them."""
    import mds.executor.batch as batch_module

    first = _pack([5, 3])["position_ids"]
    first += 1000  # a trainer writing into its tensor
    for lengths in ([2, 9], [4000, 1, 300], [7]):
        got = _pack(lengths)["position_ids"]
        assert got.tolist() == [p for n in lengths for p in range(n)]
    assert first.tolist() == [1000, 1001, 1002, 1003, 1004, 1000, 1001, 1002]
    assert len(batch_module._COUNT) >= 4301 and not batch_module._COUNT.flags.writeable


def test_an_empty_micro_batch_has_empty_tensors_and_one_boundary():
    batch = _pack([])
    assert batch["input_ids"].shape == (0,) and batch["cu_seqlens"].tolist() == [0]
    assert batch["max_seqlen"] == 0 and batch["source"].shape == (0,)


def test_the_docs_table_lists_exactly_the_keys_of_a_micro_batch():
    section = DOC.split("## A micro-batch", 1)[1].split("\n## ", 1)[0]
    text, vision = section.split("A plan made with `[vision]`", 1)
    documented = re.findall(r"^\| `(\w+)` \|", text, flags=re.M)
    assert sorted(documented) == sorted(_pack([3]))
    # a vision plan's micro-batches: the text keys and the second table's
    from mds.core.vision import VisionGeometry

    columns = dict(source=np.zeros(1), sample_id=np.arange(1), row=np.arange(1), step=0)
    raw = compact([np.arange(3)], micro_batch=0, vision=VisionGeometry(), **columns)
    documented += re.findall(r"^\| `(\w+)` \|", vision, flags=re.M)
    assert sorted(documented) == sorted(expand(raw))


@given(
    st.lists(st.integers(0, 40), max_size=12),
    st.sampled_from([0, 2**31 - 1, 2**31, -(2**31) - 1]),
)
def test_compact_arrays_expand_to_the_packed_batch(lengths, big):
    """What a DataLoader worker sends (4-byte ids where they fit) gives the same tensors."""
    tokens = [np.arange(n, dtype=np.int64) * (i + 1) + big for i, n in enumerate(lengths)]
    n = len(lengths)
    columns = dict(
        source=np.arange(n) % 3, sample_id=np.arange(n), row=np.arange(n), step=2, micro_batch=0
    )
    raw = compact(tokens, narrow=True, **columns)
    fits = all(-(2**31) <= t.min() and t.max() < 2**31 for t in tokens if len(t))
    assert raw["tokens"].dtype == (np.int32 if fits and sum(lengths) else np.int64)
    got, want = expand(raw), pack(tokens, **columns)
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and torch.equal(got[key], value)
        else:
            assert got[key] == value
