"""`give_back` returns the free pages inside malloc's heap, not only at its top."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHILD = """
from mds.core.freed_memory import give_back

def anon_kb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

blocks = [bytearray(16 << 10) for _ in range(4096)]  # 64 MB of small heap blocks, touched
keep = blocks[::64]  # one block in 64 lives on: the heap cannot shrink from its top
del blocks
before = anon_kb()
give_back()
print(before - anon_kb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_free_pages_between_live_blocks_go_back_to_the_system():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    returned_mb = int(out.stdout.strip()) / 1024
    assert returned_mb > 32, f"{returned_mb:.1f} MB returned of ~63 MB freed"
