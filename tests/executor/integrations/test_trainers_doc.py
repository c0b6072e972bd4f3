"""docs/trainers.md runs as written: its plan command, then the Lightning and Hugging Face
examples, each twice (the second run resumes from the first one's checkpoints), in a work
directory holding sample_data/ and its index at build/index. The Megatron-LM and torchtitan
blocks need those frameworks' training code; their adapters are tested in their own files."""

from __future__ import annotations

import contextlib
import re
import shutil
from pathlib import Path

import pytest
from cli_helpers import mds, run_python
from plan_builders import REPO, sample_index

DOC = (REPO / "docs" / "trainers.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", DOC, re.S | re.M)
    assert match is not None, title
    return match.group(1)


def python_block(title: str) -> str:
    (block,) = re.findall(r"^```python\n(.*?)^```", section(title), re.S | re.M)
    return block


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("trainers-doc")
    shutil.copytree(REPO / "sample_data", work / "sample_data")
    shutil.copytree(sample_index(tmp_path_factory), work / "build" / "index")
    (plan_block,) = re.findall(r"^```sh\n(.*?)^```", DOC, re.S | re.M)
    with contextlib.chdir(work):
        argv = plan_block.split()
        assert argv[0] == "mds"
        result = mds(*argv[1:])
        assert result.exit_code == 0, result.output
    return work


@pytest.mark.slow
@pytest.mark.parametrize(
    ("title", "checkpoints"),
    [
        ("PyTorch Lightning", "build/lightning/**/last.ckpt"),
        ("Hugging Face Trainer", "build/hf/checkpoint-2"),
    ],
)
def test_example_runs_and_resumes(workdir, title, checkpoints):
    heading = next(h for h in re.findall(r"^## (.*)$", DOC, re.M) if h.startswith(title))
    script = workdir / f"train_{title.split()[-1].lower()}.py"
    script.write_text(python_block(heading), encoding="utf-8")
    for _ in range(2):  # the second run resumes from the first one's checkpoints
        run_python(script, workdir)
        assert list(workdir.glob(checkpoints))
