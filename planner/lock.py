"""One writer at a time per index or plan: a lock file next to the output.

The lock is `.NAME.lock` beside the output (never inside an index, hidden, so never data),
created with O_CREAT|O_EXCL and holding the writer's pid, host and start time. O_EXCL rather
than flock: it works on every local and network filesystem, and the holder is readable for
the error message. A lock whose pid is dead on this host is taken over; it is removed when
the writer exits, on success, error or interrupt (only SIGKILL leaves it, and the next
writer on the host takes it over).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mds.executor.errors import ConfigError
from mds.planner.atomic import pid_alive

__all__ = ["lock_path", "output_lock"]


def lock_path(output: Path) -> Path:
    return output.with_name(f".{output.name}.lock")


def _holder(lock: Path) -> dict | None:
    try:
        data = json.loads(lock.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # being written this instant, or damaged: treat as held


def _try_create(lock: Path, record: bytes) -> bool:
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, record)
    finally:
        os.close(fd)
    return True


@contextmanager
def output_lock(output: Path) -> Iterator[Path]:
    """Hold the lock of `output` for the block; raise ConfigError if another writer has it."""
    output = Path(output)
    lock = lock_path(output)
    lock.parent.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()
    record = json.dumps(
        {"pid": os.getpid(), "host": host, "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    ).encode()
    for _ in range(3):
        if _try_create(lock, record):
            break
        holder = _holder(lock)
        if holder is None:
            continue  # released meanwhile
        pid = holder.get("pid")
        if holder.get("host") == host and isinstance(pid, int) and not pid_alive(pid):
            lock.unlink(missing_ok=True)  # its writer died (SIGKILL): take it over
            continue
        raise ConfigError(
            f"{output} is being written by pid {pid} on host {holder.get('host')} since "
            f"{holder.get('since')}; wait for it or remove {lock} if that process is gone"
        )
    else:
        raise ConfigError(f"{output}: cannot take the lock {lock}; remove it if no mds runs")
    try:
        yield lock
    finally:
        lock.unlink(missing_ok=True)
