"""`give_back` returns the free pages inside malloc's heap, not only at its top."""

from __future__ import annotations

import os
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
@pytest.mark.parametrize(("setting", "returned"), [("on", True), ("off", False)])
def test_free_pages_between_live_blocks_go_back_to_the_system(setting, returned):
    env = {**os.environ, "MDS_GIVE_BACK": setting}
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, env=env
    )
    returned_mb = int(out.stdout.strip()) / 1024
    if returned:
        assert returned_mb > 32, f"{returned_mb:.1f} MB returned of ~63 MB freed"
    else:  # MDS_GIVE_BACK=off: the process keeps what it freed
        assert returned_mb < 8, f"{returned_mb:.1f} MB returned with {setting}"


def test_a_wrong_setting_is_one_line_naming_it(monkeypatch):
    from mds.core.freed_memory import give_back
    from mds.errors import ConfigError

    monkeypatch.setenv("MDS_GIVE_BACK", "sometimes")
    with pytest.raises(ConfigError, match="MDS_GIVE_BACK='sometimes' must be on or off"):
        give_back()
