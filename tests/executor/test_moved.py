"""The executor's old module paths keep giving every public name they had before the
modules moved to mds.core and mds.formats (tests/executor/moved_names.json lists them,
read from the last release's files), with a DeprecationWarning for the moved ones."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from mds.executor.moved import MOVED

OLD_NAMES = json.loads(Path(__file__).with_name("moved_names.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("old", sorted(OLD_NAMES))
def test_every_old_public_name_still_imports(old):
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    moved = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert bool(moved) == (old in MOVED), [str(w.message) for w in caught]
    missing = [name for name in OLD_NAMES[old] if not hasattr(module, name)]
    assert missing == [], f"{old} lost {missing}"


def test_an_old_path_gives_the_same_objects():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from mds.executor.errors import MdsError
        from mds.executor.planfile import PlanReader
    import mds.core.planfile_reader
    import mds.errors

    assert MdsError is mds.errors.MdsError
    assert PlanReader is mds.core.planfile_reader.PlanReader


def test_every_new_home_exists():
    for targets in MOVED.values():
        for target in targets:
            importlib.import_module(target)


def test_an_old_path_loads_nothing_heavy_until_used():
    code = (
        "import sys, warnings; warnings.simplefilter('ignore');"
        "import mds.executor.storage, mds.executor.errors;"
        "print(sorted(m for m in ('torch', 'polars', 'mds.planner') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_name_that_never_was_is_an_attribute_error():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import mds.executor.storage as old
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        old.nothing_here  # noqa: B018
