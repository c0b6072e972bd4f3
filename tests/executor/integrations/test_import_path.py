"""The adapters stay out of the executor's import path: training without a framework never
loads one."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_executor_loads_no_framework():
    code = (
        "import sys, mds.executor; from mds.executor import PlanExecutor, PlanLoader; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('lightning', 'pytorch_lightning', 'transformers', 'accelerate') "
        "or m.startswith('mds.executor.integrations')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
