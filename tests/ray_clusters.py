"""Helpers for Ray clusters started on this machine by tests and benchmarks."""

from __future__ import annotations

from pathlib import Path


def unadvertise(cluster) -> None:
    """`ray.cluster_utils.Cluster` writes its address where any ray.init() on this machine
    (another program's or test run's) would find and join it: removed at once."""
    from ray._common.utils import get_ray_address_file

    path = Path(get_ray_address_file(None))
    try:
        if path.read_text().strip() == cluster.address:
            path.unlink()
    except OSError:
        pass
