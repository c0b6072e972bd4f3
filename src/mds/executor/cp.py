"""Context parallelism in the executor: each CP rank's slice of a micro-batch.

A plan made with `cp_size` > 1 records how its micro-batches lie over the CP ranks as a rule
(`mds.core.cp_layout`): per sample, SPLIT (head-tail over every CP rank) or the CP rank that
holds it whole, a pure function of the samples' planned lengths in micro-batch order. The
executor computes it per micro-batch (`layout`), puts it in the whole micro-batch
(`cp_layout`, `cp_size`), and `cp_slice` cuts the micro-batch down to one CP rank's part.

A CP rank's slice keeps the micro-batch's sample order. A split sample of L tokens is padded
to P = ceil(L / 2cp) * 2cp (token id 0, label -100) and cut into 2cp chunks of c = P / 2cp;
CP rank i holds chunks i and 2cp-1-i, in that order (Transformer Engine's
`thd_get_partitioned_indices`, Megatron-core's `get_batch_on_this_cp_rank`). A whole sample
is all on its rank, and nothing of it on the others. Labels are shifted before the cut
(`shift_labels`: token t's label is token t+1 of its sample), since a chunk's last token
predicts the first token of a chunk another rank may hold. docs/executor.md, "Context
parallelism", lists the keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mds.core.cp_layout import SPLIT, chunk_size, cp_layout
from mds.errors import ConfigError, PlanError

__all__ = [
    "CP_KEYS",
    "CPSettings",
    "cp_slice",
    "layout",
    "plan_cp",
    "planned_lengths",
    "shifted_labels",
    "split_token_mask",
]

IGNORE_INDEX = -100
PAD_ID = 0

# keys of a CP rank's slice that the whole micro-batch does not have (or has otherwise)
CP_KEYS = (
    "shift_labels",
    "cp_samples",
    "cu_seqlens_split",
    "cu_seqlens_split_padded",
    "max_seqlen_split",
    "seqlens",
    "cp_rank",
)


@dataclass(frozen=True)
class CPSettings:
    """A plan's CP settings, from its footer (`config.train`)."""

    size: int
    split_from: int
    linear: int


def plan_cp(footer: Mapping[str, Any], where: Any = "the plan") -> CPSettings | None:
    """The plan's CP settings, or None for a plan made without `cp_size` > 1."""
    config = footer.get("config")
    train = config.get("train") if isinstance(config, Mapping) else None
    size = train.get("cp_size", 1) if isinstance(train, Mapping) else 1
    if size == 1:
        return None
    try:
        settings = CPSettings(int(size), int(train["cp_split_from"]), int(train["cp_linear"]))
    except (KeyError, TypeError, ValueError):
        raise PlanError(
            f"{where}: corrupt plan footer (cp_size {size!r} without its settings)"
        ) from None
    if settings.size < 2 or settings.split_from < 1 or settings.linear < 0:
        raise PlanError(f"{where}: corrupt plan footer (CP settings {settings})")
    return settings


def check_mesh(settings: CPSettings | None, cp_size: int | None, cp_rank: int | None, where):
    """Refuse a CP size or rank that is not the plan's: (cp_rank or None)."""
    planned = settings.size if settings is not None else 1
    if cp_size is not None and cp_size != planned:
        if planned == 1:
            raise ConfigError(
                f"this job has cp_size {cp_size}, but {where} was planned without context "
                f"parallelism; re-plan with cp_size = {cp_size} in [train]"
            )
        raise ConfigError(
            f"this job has cp_size {cp_size}, but {where} was planned for cp_size {planned}; "
            f"re-plan with cp_size = {cp_size}, or run with cp={planned}"
        )
    if cp_rank is None:
        return None
    if planned == 1:
        if cp_rank != 0:
            raise ConfigError(f"cp_rank {cp_rank} given, but {where} was planned without CP")
        return None
    if not 0 <= cp_rank < planned:
        raise ConfigError(
            f"cp_rank {cp_rank} is outside {where}'s cp_size {planned} (valid: 0..{planned - 1})"
        )
    return cp_rank


def planned_lengths(fetch_tokens: np.ndarray, truncate_to: int | None) -> np.ndarray:
    """Each sample's packed length as planned: its fetch `tokens`, capped at the micro-batch
    capacity under overlong = "truncate"."""
    lengths = np.asarray(fetch_tokens, dtype=np.int64)
    return np.minimum(lengths, truncate_to) if truncate_to is not None else lengths


def layout(lengths: np.ndarray, settings: CPSettings) -> np.ndarray:
    """`cp_layout` of a micro-batch's planned lengths, as int32 (SPLIT = -1 or a CP rank)."""
    got = cp_layout(lengths.tolist(), settings.size, settings.split_from, settings.linear)
    return np.array(got, dtype=np.int32)


def shifted_labels(ids: np.ndarray, cu: np.ndarray) -> np.ndarray:
    """Next-token labels of a packed row: token t's label is token t+1 of the same sample,
    IGNORE_INDEX at each sample's last token."""
    labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
    if len(ids):
        labels[:-1] = ids[1:]
        ends = cu[1:][np.diff(cu) > 0] - 1
        labels[ends] = IGNORE_INDEX
    return labels


def _rank_positions(
    lengths: np.ndarray, lay: np.ndarray, cp: int, rank: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(each local token's position in its sample, the local segments' samples, their
    lengths) on CP rank `rank`: per sample in order, chunks rank and 2cp-1-rank of a split
    one (positions past its length are padding), all of a whole one held here."""
    pieces, samples, sizes = [], [], []
    for k, (n, r) in enumerate(zip(lengths.tolist(), lay.tolist(), strict=True)):
        if r == SPLIT:
            c = chunk_size(n, cp)
            if not c:
                continue
            head, tail = rank * c, (2 * cp - 1 - rank) * c
            pieces += [np.arange(head, head + c), np.arange(tail, tail + c)]
            size = 2 * c
        elif r == rank and n:
            pieces.append(np.arange(n))
            size = n
        else:
            continue
        samples.append(k)
        sizes.append(size)
    pos = np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, dtype=np.int64)
    return pos, np.array(samples, dtype=np.int32), np.array(sizes, dtype=np.int64)


def _cumsum32(sizes) -> np.ndarray:
    cu = np.zeros(len(sizes) + 1, dtype=np.int32)
    np.cumsum(sizes, out=cu[1:])
    return cu


def cp_slice(batch: Mapping[str, Any], cp_rank: int) -> dict[str, Any]:
    """CP rank `cp_rank`'s slice of a whole micro-batch of a CP plan (one that carries
    `cp_layout` and `cp_size`), as docs/executor.md, "Context parallelism", lays it out."""
    cp = int(batch["cp_size"])
    if not 0 <= cp_rank < cp:
        raise ConfigError(f"cp_rank {cp_rank} is outside cp_size {cp}")
    ids = batch["input_ids"].numpy()
    cu = batch["cu_seqlens"].numpy().astype(np.int64)
    lay = batch["cp_layout"].numpy()
    lengths = np.diff(cu)
    pos, samples, sizes = _rank_positions(lengths, lay, cp, cp_rank)
    owner = np.repeat(samples, sizes)  # each local token's sample
    valid = pos < lengths[owner]
    at = cu[:-1][owner] + pos  # its index in the whole row (past the row for padding)
    at = np.where(valid, at, 0)
    labels = shifted_labels(ids, cu)
    local_ids = np.where(valid, ids[at], PAD_ID).astype(np.int64)
    local_labels = np.where(valid, labels[at], IGNORE_INDEX).astype(np.int64)
    split = lengths[lay == SPLIT]
    padded = chunk_size(split, cp) * 2 * cp
    out = {
        "input_ids": torch.from_numpy(local_ids),
        "position_ids": torch.from_numpy(pos),
        "shift_labels": torch.from_numpy(local_labels),
        "cu_seqlens": torch.from_numpy(_cumsum32(sizes)),
        "max_seqlen": int(sizes.max(initial=0)),
        "cp_samples": torch.from_numpy(samples),
        "cu_seqlens_split": torch.from_numpy(_cumsum32(split)),
        "cu_seqlens_split_padded": torch.from_numpy(_cumsum32(padded)),
        "max_seqlen_split": int(padded.max(initial=0)),
        "seqlens": torch.from_numpy(lengths.astype(np.int32)),
        "cp_rank": cp_rank,
    }
    for key, value in batch.items():
        if key not in out and key not in ("input_ids", "position_ids", "cu_seqlens"):
            out[key] = value
    return out


def split_token_mask(piece: Mapping[str, Any]) -> torch.Tensor:
    """bool [T_r]: which of a CP slice's tokens belong to split samples. `x[mask]` is, for
    the split samples alone, Transformer Engine's THD shard of this CP rank (the layout its
    ring attention takes with `cu_seqlens_split` and `cu_seqlens_split_padded`); the other
    tokens are whole samples, for local attention."""
    seg_split = piece["cp_layout"][piece["cp_samples"].long()] == SPLIT
    return seg_split.repeat_interleave(piece["cu_seqlens"].diff().long())
