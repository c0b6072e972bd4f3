"""The docs stay true: every command has help with an example, fits 80 columns and appears
in the README; every block of README.md and docs/ that a user would paste runs, as written,
in a work directory holding a copy of sample_data/."""

from __future__ import annotations

import contextlib
import re
import shlex
import shutil
import tomllib
from pathlib import Path

import pytest
from cli_helpers import mds, run_python
from typer.testing import CliRunner

from mds import __version__ as mds_version
from mds.cli.main import app
from mds.errors import install_hint
from mds.planner.plan.config import load_plan_config

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "mds"
README = (ROOT / "README.md").read_text(encoding="utf-8")
COMMANDS = sorted(c.name for c in app.registered_commands)
# Pages whose blocks are layouts or schemas, not commands. (docs/executor.md's Python
# block is a fragment of a loop; README's "In the training loop" is the complete one.)
NOT_PASTED = {"index-format.md", "plan-format.md"}
# Pages whose blocks name the reader's own places (a mount point, a bucket): run by their
# own test below, with those places made here.
OWN_PLACES = {"storage.md"}
# Pages with their own test below: docs/loss-spike.md, which also resumes a run in Python.
OWN_TEST = {"loss-spike.md"}
MOUNT = "/mnt/shared/corpus"


def blocks(text: str, lang: str) -> list[str]:
    """The fenced ```lang blocks of a Markdown text, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


def commands(block: str) -> list[list[str]]:
    """A shell block's commands as argv lists: `\\` continues a line, `#` starts a comment."""
    joined = block.replace("\\\n", " ")
    return [argv for line in joined.splitlines() if (argv := shlex.split(line, comments=True))]


def test_there_are_commands():
    assert {"index", "plan", "export", "inspect", "verify", "diff"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(command):
    result = mds(command, "--help")
    assert result.exit_code == 0, result.output
    assert "Example:" in result.output
    assert f"mds {command}" in result.output


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_fits_80_columns(command):
    args = [command, "--help"] if command else ["--help"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    wide = [line for line in result.stdout.splitlines() if len(line) > 80]
    assert wide == []


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_is_in_the_readme(command):
    assert f"mds {command} " in README


def test_readme_config_example_is_valid(tmp_path):
    block = re.search(r"## Config by example\n\n```toml\n(.*?)```", README, re.S)
    assert block is not None
    config = tmp_path / "mds.toml"
    config.write_text(block.group(1), encoding="utf-8")
    plan = load_plan_config(config)
    assert [s.name for s in plan.sources] == ["web", "books", "math"]
    assert plan.train.dp_size == 64


def test_index_path_is_spelled_one_way():
    """README, the sample config and `--help` all index sample_data/ into build/index."""
    config = tomllib.loads((ROOT / "sample_data" / "mds.toml").read_text(encoding="utf-8"))
    assert config["index"]["output"] == "../build/index"  # relative to sample_data/
    for text in (README, mds("index", "--help").stdout, mds("plan", "--help").stdout):
        assert "mds index sample_data/mds.toml -o build/index" in text
    assert not re.search(r"sample-index|-o index\b|\bweb-index\b", README)


def test_install_and_setup_blocks():
    """The distribution is on no package index: README installs it from the checkout
    (`.[extra]`) or from the wheel `make dist` builds, under the version's own name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
    wheel = f"dist/{project['name'].replace('-', '_')}-{mds_version}-py3-none-any.whl"
    pip_lines, make_lines = [], 0
    for block in blocks(README, "sh"):
        for argv in commands(block):
            if argv[:2] == ["pip", "install"]:
                where, extra = re.fullmatch(r"([\w./-]+)\[(\w+)\]", argv[2]).groups()
                assert where in (".", wheel) and extra in project["optional-dependencies"]
                pip_lines.append(where)
            elif argv[0] == "make":
                assert argv[1] in targets
                make_lines += 1
    assert pip_lines == [".", ".", ".", wheel] and make_lines >= 3
    assert "pip install 'mds-planner" not in README


def test_every_install_hint_is_worded_one_way():
    """Every "needs X" message and doc names the checkout or the wheel, never the package
    index, through mds.errors.install_hint."""
    assert install_hint("plan").startswith("pip install '.[plan]' in the mds checkout")
    assert f"'dist/mds_planner-{mds_version}-py3-none-any.whl[plan]'" in install_hint("plan")
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *SRC.rglob("*.py")]:
        text = path.read_text(encoding="utf-8")
        assert "mds-planner[" not in text and "'mds[" not in text, path


# --- the blocks run as written -----------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A copy of sample_data/ (where a user runs the README from the repository's root)."""
    work = tmp_path_factory.mktemp("docs")
    shutil.copytree(ROOT / "sample_data", work / "sample_data")
    return work


def test_the_new_mix_is_the_sample_config_with_other_weights():
    """sample_data/new-mix.toml, the README's re-plan config: mds.toml but for weights."""
    old, new = (
        tomllib.loads((ROOT / "sample_data" / name).read_text(encoding="utf-8"))
        for name in ("mds.toml", "new-mix.toml")
    )
    weights = lambda c: [s.pop("weight") for s in c["source"]]  # noqa: E731
    assert weights(old) != weights(new)
    assert old == new


def run_shell_block(block: str, cwd: Path) -> int:
    """Run every `mds` command of a block in `cwd`; other commands (pip, make) are checked
    elsewhere. Returns how many ran."""
    ran = 0
    with contextlib.chdir(cwd):
        for argv in commands(block):
            if argv[0] in ("pip", "make"):
                continue
            assert argv[0] == "mds", argv
            result = mds(*argv[1:])
            assert result.exit_code == 0, (argv, result.output)
            ran += 1
    return ran


@pytest.mark.slow
def test_readme_and_docs_blocks_run_as_written(workdir):
    """In README order: the tour, the training loop (rank 1 of the 4 torchrun would start,
    then again to resume from its checkpoint), the re-plan; then the docs' blocks."""
    sh = blocks(README, "sh")
    (tour,) = [b for b in sh if "mds index sample_data/mds.toml -o build/index" in b]
    (replan,) = [b for b in sh if "--at-step" in b]
    assert sh.index(tour) < sh.index(replan)
    assert run_shell_block(tour, workdir) == 13
    (train,) = blocks(README, "python")
    script = workdir / "train.py"
    script.write_text(train, encoding="utf-8")
    for _ in range(2):
        run_python(script, workdir, RANK="1", WORLD_SIZE="4")
        assert (workdir / "build" / "checkpoint-1.pt").is_file()
    assert run_shell_block(replan, workdir) == 3
    ran = 0
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name in NOT_PASTED | OWN_PLACES | OWN_TEST:
            continue
        for block in blocks(page.read_text(encoding="utf-8"), "sh"):
            ran += run_shell_block(block, workdir)
    assert ran >= 7  # docs/inspect.md


@pytest.mark.slow
def test_the_loss_spike_walkthrough_runs_as_written(tmp_path):
    """docs/loss-spike.md in a copy of sample_data: every command, then its Python block.
    `mds trace` is run once the command exists (it comes with the trace change)."""
    shutil.copytree(ROOT / "sample_data", tmp_path / "sample_data")
    page = (ROOT / "docs" / "loss-spike.md").read_text(encoding="utf-8")
    ran = 0
    with contextlib.chdir(tmp_path):
        for block in blocks(page, "sh"):
            for argv in commands(block):
                assert argv[0] == "mds", argv
                if argv[1] not in COMMANDS:
                    assert argv[1] == "trace", argv
                    continue
                result = mds(*argv[1:])
                assert result.exit_code == 0, (argv, result.output)
                ran += 1
    assert ran >= 7
    (resume,) = blocks(page, "python")
    script = tmp_path / "resume.py"
    script.write_text(resume, encoding="utf-8")
    run_python(script, tmp_path)


def test_storage_blocks_run_with_the_data_moved(workdir, tmp_path):
    """docs/storage.md: the local layout as written; the moved layout with the mount point
    made here (a copy of the data, mtimes not kept) and the launcher line left out; the
    object-store layout is run against a real S3 server by tests/executor/test_storage_*."""
    page = (ROOT / "docs" / "storage.md").read_text(encoding="utf-8")
    local, verify_moved, reindex_moved, objects = blocks(page, "sh")
    assert run_shell_block(local, workdir) == 3
    moved = tmp_path / "corpus"
    shutil.copytree(workdir / "sample_data", moved, copy_function=shutil.copyfile)
    launcher = [ln for ln in verify_moved.splitlines() if not ln.startswith("mds ")]
    assert len(launcher) == 1 and "MDS_DATA_ROOT=" + MOUNT in launcher[0]
    mds_lines = "\n".join(ln for ln in verify_moved.splitlines() if ln.startswith("mds "))
    assert run_shell_block(mds_lines.replace(MOUNT, str(moved)), workdir) == 1
    assert run_shell_block(reindex_moved.replace(MOUNT, str(moved)), workdir) == 1
    assert "s3://" in page and "mds index corpus.toml" in objects


def test_every_guarantee_names_tests_that_exist():
    """docs/guarantees.md names, for each promise, the tests that prove it: each named test
    file exists under tests/ and defines each named test (`::name` continues the last file)."""
    text = (ROOT / "docs" / "guarantees.md").read_text(encoding="utf-8")
    named, last = [], None
    for ref in re.findall(r"`([\w/.]*\.py)?((?:::\w+)?)(?:\[[^\]`]*\])?`", text):
        path, test = ref
        if not path and not test:
            continue
        last = path or last
        assert last is not None, f"`{test}` names no file before it"
        named.append((last, test.removeprefix("::")))
    assert len(named) > 40
    for path, test in named:
        source = ROOT / "tests" / path
        assert source.is_file(), f"docs/guarantees.md names {path}, which is not in tests/"
        if test:
            assert re.search(rf"^def {test}\(", source.read_text(encoding="utf-8"), re.M), (
                f"docs/guarantees.md names {path}::{test}, which {path} does not define"
            )


def test_every_path_the_docs_name_exists():
    """Source and test files named in README.md and docs/ (`src/mds/...`, `tests/...`)
    exist, so a page cannot point a reader at a module that moved."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = {
        (page.name, path.rstrip("/."))
        for page in pages
        for path in re.findall(r"(?<![\w/.-])((?:src/mds|tests)/[\w/.-]*)", page.read_text("utf-8"))
    }
    assert any(page == "architecture.md" for page, _ in named)
    missing = sorted(f"{page}: {path}" for page, path in named if not (ROOT / path).exists())
    assert missing == []


def test_architecture_follows_a_sample_through_every_folder():
    """docs/architecture.md names a file in each folder of the package, and the README's
    layout section points to it."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    folders = {p.parent for p in (ROOT / "src" / "mds").rglob("*.py")}
    unnamed = sorted(
        str(f.relative_to(ROOT)) for f in folders if str(f.relative_to(ROOT)) + "/" not in text
    )
    assert unnamed == []
    assert "docs/architecture.md" in README.split("## Layout", 1)[1]
