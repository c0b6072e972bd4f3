"""Pack one micro-batch's samples into the tensors a varlen-attention training step wants.

Samples are concatenated into one row of `input_ids`; `cu_seqlens` marks where each starts
(flash-attention's varlen convention) and `position_ids` restart at 0 for every sample.

A micro-batch built in a DataLoader worker crosses to the training process as `compact`
numpy arrays (token ids at 4 bytes where they fit, no position ids) and becomes tensors
there (`expand`): torch sends tensors between processes through one shared-memory file
each, which cost about 3 ms a micro-batch, against 0.5 ms for the compact arrays.

A plan made with a `[vision]` geometry packs image-text samples too (`catalog.tokens.
VisionSample`): their images are decoded and cut into patches here (`images.process`), so in
whichever thread or worker process builds the micro-batch, and each image puts its
placeholder tokens (vision start, `image_token_id` per merged patch, vision end) where the
sample's text says. Such a micro-batch also carries the images' patch rows, grids, patch
offsets and samples, and labels with -100 at every image token (docs/executor.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mds.core.vision import VisionGeometry
from mds.errors import SourceDataError
from mds.executor import images as _images
from mds.executor.catalog.tokens import VisionSample

__all__ = ["IGNORE_INDEX", "compact", "expand", "pack"]

IGNORE_INDEX = -100  # the label of a token no loss is taken at (torch's cross_entropy default)

_INT32 = np.iinfo(np.int32)
_COUNT = np.zeros(0, dtype=np.int64)  # 0, 1, 2, ... (`_count_to`)


def _count_to(n: int) -> np.ndarray:
    """0 .. n-1 as a read-only view of one array kept for every micro-batch, grown by
    doubling: a fresh arange per micro-batch is one more fresh allocation, and its page
    faults cost more than the arithmetic."""
    global _COUNT
    count = _COUNT
    if len(count) < n:
        count = np.arange(max(n, 2 * len(count)), dtype=np.int64)
        count.flags.writeable = False
        _COUNT = count
    return count[:n]


def compact(
    tokens: list[np.ndarray],
    *,
    source: np.ndarray,
    sample_id: np.ndarray,
    row: np.ndarray,
    step: int,
    micro_batch: int,
    narrow: bool = False,
    vision: VisionGeometry | None = None,
    truncate_to: int | None = None,
) -> dict[str, Any]:
    """The micro-batch as numpy arrays: token ids concatenated (int32 when `narrow` and
    they fit), each sample's length, and the per-sample columns. With `vision` (the plan's
    geometry), image-text samples are assembled with their images (`_with_images`)."""
    extra: dict[str, Any] = {}
    if vision is not None:
        tokens, extra = _with_images(tokens, vision, truncate_to)
    lengths = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
    # int64 whatever each sample's integer type (a Parquet int32 list, a Megatron uint16 .bin)
    ids = np.concatenate(tokens, dtype=np.int64) if tokens else np.zeros(0, dtype=np.int64)
    if narrow and len(ids) and _INT32.min <= ids.min() and ids.max() <= _INT32.max:
        ids = ids.astype(np.int32)
    return {
        "tokens": ids,
        "lengths": lengths,
        "source": source.astype(np.int32),
        "sample_id": sample_id.astype(np.int64),
        "row": row.astype(np.int64),
        "step": step,
        "micro_batch": micro_batch,
        **extra,
    }


def _image_ids(vision: VisionGeometry, n: int) -> np.ndarray:
    """An image's backbone tokens: vision start, `n` placeholders, vision end."""
    ids = [vision.image_token_id] * n
    if vision.vision_start_id is not None:
        ids.insert(0, vision.vision_start_id)
    if vision.vision_end_id is not None:
        ids.append(vision.vision_end_id)
    return np.array(ids, dtype=np.int64)


def _with_images(
    tokens: list, vision: VisionGeometry, truncate_to: int | None
) -> tuple[list[np.ndarray], dict[str, Any]]:
    """Each sample's token ids with its images' tokens in place, and the images' arrays:
    patch rows, grids, the sample each is of and the span of its tokens in the row.

    A sample's length must be the plan's (its backbone length: text and image tokens);
    under estimated="fit" a longer one is cut to it. Under overlong="truncate" a sample is
    cut to `truncate_to` tokens (the planner refuses image-text samples that would need it).
    A cut never falls inside an image: an image it would split is left out with everything
    after it."""
    out: list[np.ndarray] = []
    patches: list[np.ndarray] = []  # each image resized, RGB uint8
    grids: list[tuple[int, int, int]] = []
    owner: list[int] = []
    spans: list[tuple[int, int]] = []
    start = 0  # the sample's first token in the row
    merge = vision.merge_size * vision.merge_size
    for k, sample in enumerate(tokens):
        if not isinstance(sample, VisionSample):
            out.append(sample)
            start += len(sample)
            continue
        n = len(sample.images)
        if sample.marked:  # piece 0, image 0, piece 1, ..., image n-1, piece n
            order = [x for i in range(n) for x in (sample.pieces[i], i)] + [sample.pieces[n]]
        else:  # the images, then the text
            order = [*range(n), *sample.pieces]
        parts: list[np.ndarray] = []
        mine: list[tuple[np.ndarray, tuple[int, int, int], int, int]] = []
        at = 0
        for item in order:
            if isinstance(item, int):
                # decoded and resized now; cut into patch rows once the micro-batch's
                # pixel_values array is made, straight into its slice
                rgb = _images.resized_rgb(sample.images[item], vision, sample.names[item])
                gh, gw = rgb.shape[0] // vision.patch_size, rgb.shape[1] // vision.patch_size
                piece = _image_ids(vision, gh * gw // merge)
                mine.append((rgb, (1, gh, gw), at, at + len(piece)))
            else:
                piece = item
            parts.append(piece)
            at += len(piece)
        ids = np.concatenate(parts, dtype=np.int64) if parts else np.zeros(0, dtype=np.int64)
        limit = truncate_to
        if sample.planned is not None and len(ids) != sample.planned:
            if sample.exact:
                image = sum(hi - lo for _r, _g, lo, hi in mine)
                raise SourceDataError(
                    f"{sample.where}: {len(ids)} tokens ({len(ids) - image} of text, {image} of "
                    f"{len(mine)} images), the plan says {sample.planned}; the plan was made "
                    "with other lengths (different tokenizer or image geometry, or changed data)"
                )
            if len(ids) > sample.planned:  # estimated="fit": never longer than planned
                limit = sample.planned if limit is None else min(limit, sample.planned)
        if limit is not None and len(ids) > limit:
            cut = limit
            for _rows, _grid, lo, hi in mine:
                if lo < cut < hi:
                    cut = lo
            mine = [m for m in mine if m[3] <= cut]
            ids = ids[:cut]
        for rows, grid, lo, hi in mine:
            patches.append(rows)
            grids.append(grid)
            owner.append(k)
            spans.append((start + lo, start + hi))
        out.append(ids)
        start += len(ids)
    total = sum(g[1] * g[2] for g in grids)
    pixels = np.empty((total, vision.patch_dim), dtype=np.float32)
    at = 0
    for rgb, (_t, gh, gw) in zip(patches, grids, strict=True):
        _images.patchify(rgb, vision, out=pixels[at : at + gh * gw])
        at += gh * gw
    extra = {
        "pixel_values": pixels,
        "image_grid_thw": np.array(grids, dtype=np.int64).reshape(-1, 3),
        "image_sample": np.array(owner, dtype=np.int32),
        "image_spans": np.array(spans, dtype=np.int64).reshape(-1, 2),
    }
    return out, extra


def expand(raw: dict[str, Any]) -> dict[str, Any]:
    """The micro-batch dict documented in docs/executor.md, from `compact`'s arrays."""
    lengths = raw["lengths"]
    cu = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu[1:])
    total = int(cu[-1])
    positions = np.repeat(cu[:-1].astype(np.int64), lengths)  # each token's sample start
    np.subtract(_count_to(total), positions, out=positions)  # its place minus that start
    ids = raw["tokens"].astype(np.int64, copy=False)
    out = {
        "input_ids": torch.from_numpy(ids),
        "position_ids": torch.from_numpy(positions),
        "cu_seqlens": torch.from_numpy(cu),
        "max_seqlen": int(lengths.max(initial=0)),
        "source": torch.from_numpy(raw["source"]),
        "sample_id": torch.from_numpy(raw["sample_id"]),
        "row": torch.from_numpy(raw["row"]),
        "step": raw["step"],
        "micro_batch": raw["micro_batch"],
    }
    if "cp_layout" in raw:  # a CP plan's micro-batch: how its samples lie over the CP ranks
        out["cp_layout"] = torch.from_numpy(raw["cp_layout"])
        out["cp_size"] = raw["cp_size"]
    if "pixel_values" in raw:
        grids = raw["image_grid_thw"]
        patches = np.zeros(len(grids) + 1, dtype=np.int32)
        np.cumsum(grids.prod(axis=1), out=patches[1:])
        pixels = raw["pixel_values"]  # a tensor when it came from a worker in shared memory
        out["pixel_values"] = pixels if torch.is_tensor(pixels) else torch.from_numpy(pixels)
        out["image_grid_thw"] = torch.from_numpy(grids)
        out["image_cu_seqlens"] = torch.from_numpy(patches)
        out["image_sample"] = torch.from_numpy(raw["image_sample"])
        out["labels"] = torch.from_numpy(_labels(ids, cu, raw["image_spans"]))
    return out


def _labels(ids: np.ndarray, cu: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """The token ids with IGNORE_INDEX at each sample's first token (nothing predicts it
    from the sample before) and at every image token (its start, placeholders and end)."""
    labels = ids.copy()
    labels[cu[:-1][np.diff(cu) > 0]] = IGNORE_INDEX
    if len(spans):
        mark = np.zeros(len(ids) + 1, dtype=np.int32)
        np.add.at(mark, spans[:, 0], 1)
        np.add.at(mark, spans[:, 1], -1)
        labels[np.cumsum(mark[:-1]) > 0] = IGNORE_INDEX
    return labels


def pack(tokens: list[np.ndarray], **columns: Any) -> dict[str, Any]:
    """The micro-batch dict documented in docs/executor.md."""
    return expand(compact(tokens, **columns))
