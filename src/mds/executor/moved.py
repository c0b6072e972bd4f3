"""The executor's old module paths (`mds.executor.storage`, `mds.executor.errors`, ...),
kept importable for one release after the modules moved to `mds.core` and `mds.formats`.

Importing an old path warns once (DeprecationWarning) and gives a module whose public names
are looked up in the new modules on first use, so the old path costs nothing until used.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

# old path -> the modules that now hold its public names, searched in order
MOVED: dict[str, tuple[str, ...]] = {
    "mds.executor.ahead": ("mds.executor.readahead",),
    "mds.executor.datacheck": ("mds.core.datacheck",),
    "mds.executor.errors": ("mds.errors",),
    "mds.executor.fingerprint": ("mds.core.fingerprint",),
    "mds.executor.ipc_ranges": ("mds.formats.arrow_ipc",),
    "mds.executor.lookahead": ("mds.executor.catalog.early_rows",),
    "mds.executor.lru": ("mds.core.lru",),
    "mds.executor.manifest": ("mds.core.index_manifest",),
    "mds.executor.megatron": ("mds.formats.megatron",),
    "mds.executor.metacache": ("mds.core.metacache",),
    "mds.executor.parquet_pages": ("mds.formats.parquet.pages",),
    "mds.executor.parquet_thrift": (
        "mds.formats.parquet.thrift",
        "mds.formats.parquet.footer",
        "mds.formats.parquet.compression",
        "mds.formats.parquet.rle",
    ),
    "mds.executor.planfile": (
        "mds.core.planfile",
        "mds.core.planfile_reader",
        "mds.core.planfile_writer",
        "mds.core.planfile_v2",
    ),
    "mds.executor.ranges": ("mds.core.object_ranges",),
    "mds.executor.sources": (
        "mds.executor.catalog.sources",
        "mds.executor.catalog.tokens",
        "mds.executor.catalog.recheck",
        "mds.core.index_manifest",
    ),
    "mds.executor.storage": ("mds.core.storage", "mds.core.commit"),
    "mds.executor.tokenizer": ("mds.core.tokenizer",),
    "mds.executor.zstd_seek": ("mds.formats.zstd_frames",),
}


def _forwarding(old: str, targets: tuple[str, ...]) -> types.ModuleType:
    """A module standing for `old` whose public attributes come from `targets`."""
    module = types.ModuleType(old, f"Moved: see {', '.join(targets)}.")

    def __getattr__(name: str) -> Any:
        if not name.startswith("_"):
            for target in targets:
                new = importlib.import_module(target)
                if hasattr(new, name):
                    return getattr(new, name)
        raise AttributeError(f"module {old!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        names: set[str] = set()
        for target in targets:
            names.update(n for n in dir(importlib.import_module(target)) if not n.startswith("_"))
        return sorted(names)

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    module.__dir__ = __dir__  # type: ignore[method-assign]
    return module


class MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers imports of the old paths in `MOVED` with forwarding modules."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: Any) -> types.ModuleType:
        targets = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {' and '.join(targets)}; the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return _forwarding(spec.name, targets)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install() -> None:
    """Put the finder on `sys.meta_path` once per process."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedFinder())
