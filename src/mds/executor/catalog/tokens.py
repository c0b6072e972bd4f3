"""Payloads into token ids: each used text source gets a tokenize function (the caller's, or
the tokenizer.json the index counted with), and each sample's ids are checked against the
length the plan was made with (cut to it under estimated="fit", and to the micro-batch's
budget under overlong="truncate").

An image-text sample becomes a `VisionSample`: its text cut at the image markers
(`split_segments`), each piece tokenized on its own, and its images' bytes; `batch.compact`
decodes the images, puts their placeholder tokens between the pieces and checks the
sample's whole length (text and image tokens) against the plan's, which is its backbone
length (docs/vision.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mds.core.index_manifest import payload_problem
from mds.core.planfile import RankChunk
from mds.core.tokenizer import index_tokenizer_path, load_tokenizer
from mds.core.vision import split_segments
from mds.errors import ConfigError, PlanError, SourceDataError
from mds.executor.catalog.plan_sources import JSONL, PlanSources, Source
from mds.executor.readers import IMAGE_TEXT_LAYOUTS, ImageText

__all__ = ["ESTIMATED", "TokenIds", "Tokenize", "VisionSample", "bind"]

Tokenize = Callable[[str], Sequence[int]]
ESTIMATED = ("error", "fit")
TEXT_KINDS = ("text", "image_text")  # payloads tokenized in the executor


@dataclass(slots=True)
class VisionSample:
    """An image-text sample before its images are decoded: the token ids of its text pieces
    and its images' bytes (`names`: where each came from). `marked`: image i goes after
    piece i (the text had a marker per image); else all images go first, then the text."""

    pieces: list[np.ndarray]
    images: list[bytes]
    names: list[str]
    marked: bool
    planned: int | None = None  # the plan's length of the sample, text and image tokens
    exact: bool = True  # a length that differs is an error (else cut to it, as "fit")
    where: str = ""  # the source, row, file and sample, for that error


def bind(
    plan: PlanSources, tokenize: Tokenize | Mapping[str, Tokenize] | None, estimated: str
) -> None:
    """Give every used text source a tokenize function, or say which one lacks it; refuse a
    source whose payloads cannot be replayed (estimated lengths under estimated="error")."""
    text = [s for s in plan.used if s.payload.get("kind") in TEXT_KINDS]
    if isinstance(tokenize, Mapping):
        unknown = sorted(set(tokenize) - {s.name for s in text})
        if unknown:
            raise ConfigError(
                f"tokenize has functions for {', '.join(unknown)}, which the plan does not "
                f"draw text from; text sources: {', '.join(s.name for s in text) or 'none'}"
            )
    for s in plan.used:
        kind = s.payload.get("kind")
        problem = _image_text_problem(s, plan) if s.image_text else None
        if problem is not None:
            raise PlanError(f"{plan.plan_path}: {problem}")
        problem = None if s.image_text else payload_problem(s.name, s.facts)
        if problem is not None:
            raise ConfigError(problem)
        if not s.exact and estimated == "error":
            rule = s.length.get("rule", "an estimate")
            raise ConfigError(
                f"source {s.name!r}: the plan used estimated lengths ({rule}), so its packing "
                "cannot be replayed exactly; re-index it with a tokenizer or a count column, "
                'or pass estimated="fit" to cut each sample to its planned length'
            )
        if kind in TEXT_KINDS:
            recorded = s.length.get("kind") == "tokenizer"
            if isinstance(tokenize, Mapping):
                fn = tokenize.get(s.name)
            else:  # one function: for the sources the index did not count with a tokenizer
                fn = None if recorded else tokenize
            s.tokenize = fn or _index_tokenizer(s, plan.root)


def _image_text_problem(s: Source, plan: PlanSources) -> str | None:
    """Why an image-text source's facts cannot be replayed, or None."""
    payload = s.payload
    if plan.vision is None:
        return f"source {s.name!r} holds images, but the plan has no [vision] geometry"
    layout = payload.get("layout")
    if s.fmt not in IMAGE_TEXT_LAYOUTS.get(layout, ()):
        return f"source {s.name!r}: image-text layout {layout!r} does not fit format {s.fmt!r}"
    for key in ("text", "images"):
        if not isinstance(payload.get(key), str) or not payload[key]:
            return f"source {s.name!r}: image-text payload has no {key!r}"
    return None


def _index_tokenizer(s: Source, root: Any) -> Tokenize:
    """The tokenizer.json the index counted with, checked to be the same file."""
    length = s.length
    if length.get("kind") != "tokenizer":
        raise ConfigError(
            f"source {s.name!r} stores text ({s.payload.get('column')!r}); pass tokenize= "
            f"(a function str -> token ids, or a dict {{{s.name!r}: fn}})"
        )
    tok = load_tokenizer(str(index_tokenizer_path(s.name, s.facts, root)))
    return lambda text: tok.encode(text, add_special_tokens=False).ids


class TokenIds:
    """Token ids of fetched payloads, checked against the plan's lengths."""

    def __init__(self, plan: PlanSources):
        self.sources, self.truncate_to = plan.sources, plan.truncate_to
        vision = getattr(plan, "vision", None)
        self.marker = vision.marker if vision is not None else ""

    def of_samples(self, block: RankChunk, lo: int, hi: int, payloads: list) -> list[np.ndarray]:
        """Each of samples [lo, hi)'s token ids (`of_sample`). An integer array of the
        planned length that needs no cut is used as it is, with no per-sample conversion:
        `batch.compact` turns them into int64 as it concatenates them."""
        rec = block.fetch
        planned = rec.tokens[lo:hi].tolist()
        cut = self.truncate_to
        most = max(planned, default=0) if cut is None else cut  # no planned length is cut
        out = []
        for k, payload in enumerate(payloads):
            if (
                type(payload) is np.ndarray
                and len(payload) == planned[k] <= most
                and payload.dtype.kind in "iu"
            ):
                out.append(payload)
                continue
            sid, _fid, entry = rec.files[int(rec.file[lo + k])]
            s = self.sources[sid]
            gid, row = int(block.ids[lo + k]), int(rec.row[lo + k])
            out.append(self.of_sample(s, entry, gid - s.base, row, planned[k], payload))
        return out

    def of_sample(
        self, s: Source, entry: dict[str, Any], row: int, file_row: int, planned: int, payload
    ) -> np.ndarray | VisionSample:
        """Token ids of one sample; its length must be the one the plan was made with."""
        # JSONL lines are 1-based in messages, as the indexer reports them
        where = f"line {file_row + 1}" if s.fmt in JSONL else f"row {file_row}"
        if s.fmt == "webdataset":
            where = f"sample {file_row}"
        if isinstance(payload, ImageText):
            return self.of_image_text(s, entry, row, where, planned, payload)
        if isinstance(payload, str):
            assert s.tokenize is not None
            ids = _token_ids(
                s.tokenize(payload), f"source {s.name!r} row {row} ({entry['path']} {where})"
            )
        else:
            ids = np.asarray(payload)
            if ids.dtype.kind not in "iu":
                ids = ids.astype(np.int64)
        if len(ids) != planned:
            if s.exact:
                what = "tokenize returned" if isinstance(payload, str) else "the file holds"
                raise SourceDataError(
                    f"source {s.name!r} row {row} ({entry['path']} {where}): "
                    f"{what} {len(ids)} tokens, the index says {planned}; the plan "
                    "was made with other lengths (different tokenizer, or changed data)"
                )
            ids = ids[:planned]  # estimated="fit": never longer than planned
        if self.truncate_to is not None and len(ids) > self.truncate_to:
            ids = ids[: self.truncate_to]
        return ids

    def of_image_text(
        self, s: Source, entry: dict[str, Any], row: int, where: str, planned: int, payload
    ) -> VisionSample:
        """An image-text sample's text pieces as token ids, and its images. Its length is
        checked when the images are decoded (`batch.compact`): the plan's count is its
        backbone length, text and image tokens."""
        at = f"source {s.name!r} row {row} ({entry['path']} {where})"
        pieces = split_segments(payload.text, self.marker)
        n = len(payload.images)
        if len(pieces) > 1 and len(pieces) != n + 1:
            raise SourceDataError(
                f"{at}: the text has {len(pieces) - 1} image markers {self.marker!r} and the "
                f"sample {n} images; the index refuses such a sample (file changed since "
                "indexing?)"
            )
        assert s.tokenize is not None
        ids = [_token_ids(s.tokenize(piece), at) for piece in pieces]
        return VisionSample(
            ids, payload.images, payload.names, len(pieces) > 1, planned, s.exact, at
        )


def _token_ids(out: Any, where: str) -> np.ndarray:
    """What a tokenize function returned, as int64 token ids; SourceDataError naming `where`
    and the value for anything but integers that fit int64 (a bool, 1.5, "7", None), which
    a cast would silently turn into other ids."""
    if isinstance(out, list | tuple) and {bool, np.bool_} & set(map(type, out)):
        bad = next(x for x in out if type(x) in (bool, np.bool_))
        raise SourceDataError(f"{where}: tokenize returned token id {bad!r}, not an integer")
    try:
        ids = np.asarray(out)
    except (TypeError, ValueError) as exc:
        raise SourceDataError(f"{where}: tokenize returned no array of token ids ({exc})") from None
    if ids.ndim != 1:
        raise SourceDataError(
            f"{where}: tokenize returned an array of shape {ids.shape}; it must return a flat "
            "sequence of token ids"
        )
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    if ids.dtype.kind == "u" and ids.itemsize == 8 and int(ids.max()) >= 2**63:
        bad = int(ids[np.argmax(ids >= 2**63)])
        raise SourceDataError(f"{where}: tokenize returned token id {bad}, outside int64")
    if ids.dtype.kind not in "iu":
        items = list(out) if isinstance(out, list | tuple) else ids.tolist()
        bad = next((x for x in items if type(x) is not int or not -(2**63) <= x < 2**63), items[0])
        raise SourceDataError(
            f"{where}: tokenize returned token id {bad!r} ({ids.dtype}), not an integer that "
            "fits int64"
        )
    return ids.astype(np.int64, copy=False)
