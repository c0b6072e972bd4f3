"""The engine's cases (tests/planner/engine_cases.py) run in a pytest process of their own.

They start a local Ray cluster, and a Ray driver whose raylet dies (a loaded machine can
miss its health checks) is ended by Ray on the spot: in the suite's own process that would
end the whole run without a report. Apart, it is one failed test with the cases' output.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("engine_cases.py")


@pytest.mark.slow
def test_engine_cases_pass_in_a_process_of_their_own(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(CASES),
            "--basetemp",
            str(tmp_path / "cases"),
        ],
        cwd=CASES.parents[2],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:] + _ray_fatal_lines()


def _ray_fatal_lines() -> str:
    """Ray's fatal log lines of the latest session: why a driver ended without a report."""
    logs = Path(tempfile.gettempdir(), "ray", "session_latest", "logs")
    lines = [
        line[:400]
        for log in sorted(logs.glob("python-core-driver-*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if " C " in line[:40]
    ]
    return "\nRay fatal lines:\n" + "\n".join(lines) if lines else ""
