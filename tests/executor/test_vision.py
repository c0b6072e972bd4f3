"""Micro-batches of a vision plan (made by the planner with `[vision]`): image-text samples
(JSONL naming image files, Parquet with an image column, a WebDataset shard) and text
samples packed with their images' placeholder tokens, patch rows
as transformers' Qwen2-VL processor makes them, grids, per-image offsets and samples, and
labels masked at image tokens; the same after a resume and through DataLoader workers."""

from __future__ import annotations

import hashlib
import io

import numpy as np
import pytest
import torch
from vision_builders import GEOMETRY, TOKENIZER, char_tokens, make_image_text, vision_world

from mds.errors import PlanError, SourceDataError
from mds.executor import PlanExecutor
from mds.executor.batch import compact, expand
from mds.executor.catalog.tokens import VisionSample

pytest.importorskip("PIL")

VISION_KEYS = ("pixel_values", "image_grid_thw", "image_cu_seqlens", "image_sample", "labels")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return vision_world(tmp_path_factory.mktemp("vision"))


@pytest.fixture(scope="module")
def processor():
    mod = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    g = GEOMETRY
    return mod.Qwen2VLImageProcessorPil(
        min_pixels=g.min_pixels,
        max_pixels=g.max_pixels,
        patch_size=g.patch_size,
        merge_size=g.merge_size,
        temporal_patch_size=g.temporal_patch_size,
    )


IMG, START, END = GEOMETRY.image_token_id, GEOMETRY.vision_start_id, GEOMETRY.vision_end_id


@pytest.fixture(scope="module")
def tokenizers():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER))
    return {"shots": lambda t: tok.encode(t, add_special_tokens=False).ids}


def oracle(world, processor, tokenizers, names, source, rows):
    """input_ids, labels, pixel_values, grids and image samples of a micro-batch, from the
    files and the HF processor."""
    from PIL import Image

    all_text = world["texts"]
    ids, labels, pixels, grids, owner = [], [], [], [], []
    for k, (sid, row) in enumerate(zip(source.tolist(), row_list(rows), strict=True)):
        key = (names[sid], row)
        pieces = all_text[key].split(GEOMETRY.marker)
        blobs = world["images"].get(key, [])
        parts = []
        blocks = []
        for blob in blobs:
            with Image.open(io.BytesIO(blob)) as image:
                out = processor(image, return_tensors="np")
            pixels.append(out["pixel_values"])
            _, gh, gw = out["image_grid_thw"][0].tolist()
            grids.append([1, gh, gw])
            owner.append(k)
            blocks.append([START] + [IMG] * (gh * gw // 4) + [END])
        tokenize = tokenizers.get(names[sid], char_tokens)
        text = [tokenize(p) for p in pieces]
        if len(pieces) > 1:
            for i, block in enumerate(blocks):
                parts += [(text[i], False), (block, True)]
            parts.append((text[-1], False))
        else:
            parts = [(b, True) for b in blocks] + [(text[0], False)]
        sample_ids, sample_labels = [], []
        for part, image in parts:
            sample_ids += part
            sample_labels += [-100] * len(part) if image else part
        if sample_labels:
            sample_labels[0] = -100
        ids += sample_ids
        labels += sample_labels
    pixels = np.concatenate(pixels) if pixels else np.zeros((0, GEOMETRY.patch_dim), np.float32)
    return ids, labels, pixels, grids, owner


def row_list(rows) -> list[int]:
    return rows.tolist()


def digest(mb) -> str:
    h = hashlib.blake2b()
    for key in sorted(mb):
        v = mb[key]
        h.update(key.encode())
        h.update(v.numpy().tobytes() if torch.is_tensor(v) else repr(v).encode())
    return h.hexdigest()


@pytest.mark.parametrize("rank", [0, 1])
def test_micro_batches(world, processor, tokenizers, monkeypatch, rank):
    monkeypatch.setenv("MDS_IMAGE_DECODER", "pillow")
    images_seen = 0
    with PlanExecutor(world["plan"], rank, tokenize=char_tokens) as ex:
        assert ex.vision == GEOMETRY
        for mb in ex:
            for key in VISION_KEYS:
                assert key in mb
            n = len(mb["image_grid_thw"])
            assert mb["pixel_values"].dtype == torch.float32
            assert mb["pixel_values"].shape == (int(mb["image_cu_seqlens"][-1]), 1176)
            assert mb["image_grid_thw"].dtype == torch.int64 and mb["image_grid_thw"].shape == (
                n,
                3,
            )
            assert mb["image_cu_seqlens"].dtype == torch.int32
            assert mb["image_cu_seqlens"].shape == (n + 1,)
            assert mb["image_sample"].dtype == torch.int32 and mb["image_sample"].shape == (n,)
            assert mb["labels"].dtype == torch.int64
            assert mb["labels"].shape == mb["input_ids"].shape
            ids, labels, pixels, grids, owner = oracle(
                world, processor, tokenizers, ex.source_names, mb["source"], mb["row"]
            )
            assert mb["input_ids"].tolist() == ids
            assert mb["labels"].tolist() == labels
            assert mb["image_grid_thw"].tolist() == grids
            assert mb["image_sample"].tolist() == owner
            np.testing.assert_array_equal(mb["pixel_values"].numpy(), pixels)
            patches = np.cumsum([0] + [t * h * w for t, h, w in grids])
            assert mb["image_cu_seqlens"].tolist() == patches.tolist()
            # placeholders: one per merged patch, as the model counts them
            assert int((mb["input_ids"] == IMG).sum()) == sum(h * w // 4 for _, h, w in grids)
            images_seen += n
    assert images_seen > 5


def test_resume_and_workers(world):
    """seek(k) gives an uninterrupted run's batches from k; DataLoader workers the same."""
    with PlanExecutor(world["plan"], 1, tokenize=char_tokens) as ex:
        whole = [digest(mb) for mb in ex]
    assert len(whole) == 12
    for k in (1, 4, 7):
        with PlanExecutor(world["plan"], 1, tokenize=char_tokens, read_ahead=0) as ex:
            ex.seek(*divmod(k, ex.micro_batches))
            assert [digest(mb) for mb in ex] == whole[k:]
    with PlanExecutor(world["plan"], 1, tokenize=char_tokens) as ex:
        state = None
        for i, _mb in enumerate(ex):
            if i == 4:
                state = ex.state_dict()
                break
    with PlanExecutor(world["plan"], 1, tokenize=char_tokens) as ex:
        ex.load_state_dict(state)
        assert [digest(mb) for mb in ex] == whole[5:]
    with PlanExecutor(world["plan"], 1, tokenize=char_tokens) as ex:
        got = [digest(mb) for mb in ex.dataloader(num_workers=2)]
    assert got == whole


def test_refusals(world):
    def wrong(text):
        return char_tokens(text) + [1]

    tokenize = {"caps": wrong, "pics": wrong, "plain": char_tokens}
    with PlanExecutor(world["plan"], 0, tokenize=tokenize) as ex:
        with pytest.raises(
            SourceDataError,
            match=r"source '(caps|pics)' row \d+ \(.*\): \d+ tokens \(\d+ of text, \d+ of \d+ "
            r"images\), the plan says \d+",
        ):
            list(ex)

    def drop_vision(footer):
        del footer["config"]["vision"]

    from executor_builders import rewrite_plan

    plan = rewrite_plan(world["plan"], world["plan"].with_name("novision.mds"), footer=drop_vision)
    with pytest.raises(PlanError, match="holds images, but the plan has no \\[vision\\]"):
        PlanExecutor(plan, 0, tokenize=char_tokens)
    plan = make_image_text(
        world["plan"], world["plan"].with_name("layout.mds"), {"caps": "parquet"}
    )
    with pytest.raises(PlanError, match="layout 'parquet' does not fit format 'jsonl'"):
        PlanExecutor(plan, 0, tokenize=char_tokens)


def sample(pieces, n_images, marked):
    from vision_builders import png

    blobs = [png(56, 84, i) for i in range(n_images)]
    return VisionSample(
        [np.array(p, dtype=np.int64) for p in pieces],
        blobs,
        [f"img{i}" for i in range(n_images)],
        marked,
    )


def test_compact_truncate_and_text_only():
    """A cut never splits an image: the image it would split goes, with what follows; a
    text-only plan's micro-batches carry none of the vision keys."""
    g = GEOMETRY  # a 56x84 image: grid 4x6, 6 placeholders + start and end
    s = sample([[1, 2], [3, 4, 5], [6]], 2, True)
    cols = dict(source=np.zeros(2), sample_id=np.arange(2), row=np.arange(2), step=0, micro_batch=0)
    raw = compact([np.array([7, 7, 7]), s], vision=g, **cols)
    mb = expand(raw)
    image = [START] + [IMG] * 6 + [END]
    assert mb["input_ids"].tolist() == [7, 7, 7, 1, 2, *image, 3, 4, 5, *image, 6]
    assert mb["image_sample"].tolist() == [1, 1]
    assert mb["labels"][:5].tolist() == [-100, 7, 7, -100, 2]
    assert mb["labels"][13:16].tolist() == [3, 4, 5]
    for cut, kept, n in ((30, 22, 2), (20, 13, 1), (12, 12, 1), (5, 2, 0), (13, 13, 1)):
        mb = expand(compact([np.array([7, 7, 7]), s], vision=g, truncate_to=cut, **cols))
        assert int(mb["cu_seqlens"][-1]) == 3 + kept
        assert len(mb["image_grid_thw"]) == n == int((mb["input_ids"] == START).sum())
        assert mb["pixel_values"].shape[0] == 24 * n
    # no markers: images first
    mb = expand(
        compact(
            [sample([[9, 9]], 1, False)],
            vision=g,
            **{**cols, "source": np.zeros(1), "sample_id": np.arange(1), "row": np.arange(1)},
        )
    )
    assert mb["input_ids"].tolist() == [START] + [IMG] * 6 + [END, 9, 9]
    assert mb["labels"].tolist() == [-100] * 8 + [9, 9]
    text = expand(
        compact(
            [np.array([1, 2])],
            **{**cols, "source": np.zeros(1), "sample_id": np.arange(1), "row": np.arange(1)},
        )
    )
    assert not set(VISION_KEYS) & set(text)
    empty = expand(
        compact(
            [],
            vision=g,
            **{**cols, "source": np.zeros(0), "sample_id": np.zeros(0), "row": np.zeros(0)},
        )
    )
    assert empty["pixel_values"].shape == (0, 1176) and empty["image_cu_seqlens"].tolist() == [0]
    assert empty["labels"].shape == (0,)
