"""The adapters stay out of the executor's import path: training without a framework never
loads one."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mds.errors import install_hint


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


@pytest.mark.parametrize(
    ("missing", "statement", "needed_by", "extra"),
    [
        ("torch", "from mds.executor import PlanExecutor", "mds.executor.PlanExecutor", "train"),
        ("torch", "from mds.executor import PlanLoader", "mds.executor.PlanLoader", "train"),
        ("lightning", "import mds.executor.integrations.lightning", None, "lightning"),
        ("torch", "import mds.executor.integrations.lightning", None, "lightning"),
        ("transformers", "import mds.executor.integrations.hf", None, "hf"),
        ("megatron", "import mds.executor.integrations.megatron_lm", None, "megatron"),
        ("torch", "import mds.executor.integrations.torchtitan", None, "train"),
        ("torch", "import mds.executor.integrations.batches", None, "train"),
    ],
)
def test_a_missing_framework_is_one_line_naming_the_extra(missing, statement, needed_by, extra):
    """The package made unimportable (None in sys.modules), nothing uninstalled: the import
    raises MissingExtraError (an MdsError and an ImportError), one line naming the extra."""
    needed_by = needed_by or statement.removeprefix("import ")
    code = (
        f"import sys; sys.modules[{missing!r}] = None\n"
        "from mds.errors import MissingExtraError\n"
        f"try:\n    {statement}\n"
        "except MissingExtraError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (
        f"{needed_by} needs {missing}, which is not installed: {install_hint(extra)}\n"
    )
