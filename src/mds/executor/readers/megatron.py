"""Megatron: sequences of a `.bin`, located through its `.idx`."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import numpy as np

from mds.core import storage
from mds.core.lru import LRU
from mds.errors import SourceDataError
from mds.executor.readers.base import BaseReader, Handle, Payload
from mds.executor.readers.base import check_rows as _check_rows
from mds.formats import megatron

__all__ = ["MegatronReader"]


def _relabel(exc: SourceDataError, path: Path, display: str) -> SourceDataError:
    """The megatron module names files by path; say `display` instead."""
    text = str(exc)
    prefix = f"{path}: "
    return SourceDataError(display + text[len(prefix) - 2 :] if text.startswith(prefix) else text)


class MegatronReader(BaseReader):
    """Sequences of a Megatron `.bin`, located through its `.idx`, read with `pread`: opening
    and memory cost the same for ten sequences or a billion (see megatron.SequenceFile)."""

    def __init__(self, path: Path, companion: Path, display: str, blocks: LRU | None = None):
        self.display = display
        self._idx_display = str(PurePosixPath(display).with_name(PurePosixPath(companion).name))
        self._paths = (path, companion)
        for p, shown in ((companion, self._idx_display), (path, display)):
            if not storage.is_url(p) and not p.exists():
                raise SourceDataError(f"{shown}: cannot open (No such file or directory)")
        try:
            self._file: megatron.SequenceFile | None = megatron.SequenceFile(
                companion, path, blocks
            )
        except SourceDataError as exc:
            raise self._relabel(exc) from None
        self.object = self._file.bin_object
        dtype = self._file.dtype
        if dtype.kind not in "iu":
            self.close()
            raise SourceDataError(f"{display}: Megatron dtype is {dtype}, not integer token ids")

    def _relabel(self, exc: SourceDataError) -> SourceDataError:
        path, companion = self._paths
        exc = _relabel(exc, companion, self._idx_display)
        return _relabel(exc, path, self.display)

    def handles(self) -> list[tuple[int, Handle]]:
        return self._file.handles() if self._file is not None else []

    def spans(self, file_rows, offsets=None, lengths=None) -> list[tuple[int, int]]:
        """The .bin spans of these sequences, for an object (their .idx entries are read
        now, through the block cache)."""
        if self._file is None or self.object is None:
            return []
        try:
            return self._file.bin_spans(np.asarray(file_rows, dtype=np.int64).tolist())
        except SourceDataError:
            return []  # raised by the fetch, with the sequence it concerns

    def fetch(self, file_rows, offsets=None, lengths=None) -> list[Payload]:
        assert self._file is not None, "fetch after close"
        rows = _check_rows(file_rows, self._file.count, self.display, unit="sequence")
        try:
            return [self._file.read(r) for r in rows.tolist()]
        except SourceDataError as exc:
            raise self._relabel(exc) from None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
