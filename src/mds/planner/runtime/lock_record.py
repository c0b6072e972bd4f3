"""What a lock says and is called, for lock files (runtime/lock.py) and lock objects
(runtime/object_lock.py) alike: the writer's record (pid, host, machine, start time), its
parsing, the error naming the holder, and the lock's name beside the output."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from mds.core import commit
from mds.errors import ConfigError
from mds.planner.runtime.atomic import shortened

__all__ = ["LOCK_NAME_MAX", "held_by", "lock_name", "lock_record", "parse_record"]

# A lock's name leaves room under NAME_MAX (255 bytes on every common filesystem) for the
# suffix of its temporary, `.tmp-PID-HOST-RANDOM`.
LOCK_NAME_MAX = 200


def lock_name(name: str) -> str:
    """`.NAME.lock`, or, when that is longer than LOCK_NAME_MAX bytes, the start of NAME and
    a hash of all of it: still beside the output, still unique to it."""
    return f".{shortened(name, LOCK_NAME_MAX - len('..lock'))}.lock"


def lock_record(**more: Any) -> dict[str, Any]:
    """What a lock (file or object) says of its writer: pid, host, machine, start time."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "machine": commit.machine_id(),
        "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **more,
    }


def held_by(
    output: Path | str, holder: dict[str, Any], lock: Path | str, more: str = ""
) -> ConfigError:
    """The error for a writer that finds `output` locked by `holder`."""
    return ConfigError(
        f"{output} is being written by pid {holder.get('pid')} on host {holder.get('host')} "
        f"since {holder.get('since')}; wait for it, or remove {lock} if that process is "
        f"gone{more}"
    )


def parse_record(data: bytes) -> dict[str, Any]:
    """The holder a lock names; {} when it is empty or damaged."""
    try:
        holder = json.loads(data.decode("utf-8"))
    except ValueError:
        return {}
    if not isinstance(holder, dict) or not isinstance(holder.get("pid"), int):
        return {}
    return holder
