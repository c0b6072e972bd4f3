"""One rank of a test in tests/examples/test_train_tiny.py, started by torchrun: runs
examples/train_tiny.py's main() in this process, then writes OUT/rank<RANK>.json with its
exit status and the names of the threads still in the process (Linux: /proc/self/task).

main() ends by destroying the process group, so none of the group's threads may be left by
then to run into interpreter shutdown.

Usage: torchrun --standalone --nproc_per_node=2 train_tiny_exit_worker.py OUT ARGS...
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_tiny.py"


def thread_names() -> list[str]:
    names = []
    for tid in sorted(os.listdir("/proc/self/task")):
        try:
            names.append(Path(f"/proc/self/task/{tid}/comm").read_text().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return names


def main(out: str, *argv: str) -> None:
    spec = importlib.util.spec_from_file_location("train_tiny", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    status = module.main(list(argv))
    record = {"status": status, "threads": thread_names()}
    Path(out, f"rank{os.environ['RANK']}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(*sys.argv[1:])
