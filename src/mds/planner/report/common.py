"""`mds inspect` reports: plain dicts (the JSON of docs/inspect.md) about an index, a plan or
one plan step, plus the small numeric helpers they share. Pure: nothing here prints.

The reports themselves live in `report_index`, `report_plan` and `report_step`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from mds.core.index_manifest import IndexManifest, plan_manifest
from mds.core.planfile import MAGIC
from mds.core.storage import is_url
from mds.errors import ConfigError
from mds.planner.index.tables import MANIFEST, download_index

__all__ = ["SCHEMA", "buckets", "detect", "finite", "index_place", "plan_index", "ratio", "summary"]

SCHEMA = 1


def detect(path: str | Path) -> str:
    """ "index" for an index directory, "plan" for a plan file; anything else is an error.
    An s3:// or gs:// URL is an object (a plan) or a prefix holding an index."""
    if is_url(path):
        return _detect_url(str(path).rstrip("/"))
    path = Path(path)
    if path.is_dir():
        if (path / MANIFEST).is_file():
            return "index"
        raise ConfigError(
            f"{path}: neither an mds index (a directory with {MANIFEST}) nor an mds plan file"
        )
    if not path.exists():
        raise ConfigError(f"{path}: no such file or directory")
    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if head != MAGIC:
        raise ConfigError(f"{path}: neither an mds plan file nor an mds index directory")
    return "plan"


def _detect_url(url: str) -> str:
    from mds.core.storage import exists, join
    from mds.planner.index.objects import head

    if exists(url):
        if head(url, len(MAGIC)) != MAGIC:
            raise ConfigError(f"{url}: neither an mds plan file nor an mds index prefix")
        return "plan"
    if exists(str(join(url, MANIFEST))):
        return "index"
    from mds.core.storage import missing_hint

    raise ConfigError(
        f"{url}: no such object, and no mds index ({MANIFEST}) under it; {missing_hint(url)}"
    )


def plan_index(
    plan: str | Path, footer: dict[str, Any], index: str | Path | None = None, option: str = "--index"
) -> IndexManifest:
    """The index a plan was made from (core.index_manifest.plan_manifest); one in object
    storage (given, or recorded beside the plan's object) is copied to a temporary directory
    once per process, its tables checked by their checksums."""
    return plan_manifest(plan, footer, index, option, copy=_index_copy)


_COPIES: dict[tuple[str, Any], tuple[Any, Path]] = {}


def _index_copy(url: str, fingerprint: Any = None) -> Path:
    """A local copy of the index under `url` (as it was at `fingerprint`, where a re-index
    kept that one), kept (and removed at exit) with its temporary directory, as the tables
    are read lazily."""
    import tempfile

    key = (url.rstrip("/"), fingerprint)
    if key not in _COPIES:
        tmp = tempfile.TemporaryDirectory(prefix="mds-index-")
        _COPIES[key] = (tmp, download_index(key[0], Path(tmp.name) / "index", fingerprint))
    return _COPIES[key][1]


def index_place(manifest: IndexManifest) -> str:
    """Where an index lies, for reports: the URL of one copied from object storage."""
    for (url, _fingerprint), (_tmp, local) in _COPIES.items():
        if local == manifest.path:
            return url
    return str(manifest.path)


def finite(value: Any) -> float | None:
    """A JSON-safe float: NaN and infinities become None."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den per element; 1.0 where den is 0 (an empty step is perfectly balanced)."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)


def summary(values: np.ndarray) -> dict[str, float | None]:
    """mean, min, median, p99 (linear interpolation) and max of a per-step series."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return {"mean": None, "min": None, "median": None, "p99": None, "max": None}
    return {
        "mean": float(values.mean()),
        "min": float(values.min()),
        "median": float(np.quantile(values, 0.5)),
        "p99": float(np.quantile(values, 0.99)),
        "max": float(values.max()),
    }


def buckets(steps: int, points: int) -> tuple[int, np.ndarray]:
    """Split [0, steps) into runs of `size` = ceil(steps / points) steps; returns (size,
    first step of each run)."""
    assert points >= 1
    size = max(1, -(-steps // points))
    return size, np.arange(0, steps, size, dtype=np.int64)
