"""The package installs light on each side: every import is a declared dependency of the
extra its side installs, planning never imports torch, training never imports polars or
the command line, and the built wheel works in a clean venv (core, then `plan`)."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from cli_helpers import mds
from plan_builders import SAMPLE_CONFIG, sample_index

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]

# Which extras each folder of the package may import from, besides the core.
SIDES = {
    "src/mds": (),
    "src/mds/core": ("tokenizers",),
    "src/mds/formats": (),
    "src/mds/executor": ("train", "tokenizers", "vision"),
    "src/mds/executor/integrations": (
        "train",
        "tokenizers",
        "vision",
        "lightning",
        "hf",
        "megatron",
    ),
    "src/mds/planner": ("plan", "tokenizers", "ray", "s3", "gcs"),
    "src/mds/cli": ("plan",),
}
# Files that run on a training box although they live in a planning folder: `mds calibrate`
# times the user's model, so it takes the `train` extra too (it says so when torch is missing).
TRAINING_FILES = {
    "src/mds/planner/calibrate/fit.py",
    "src/mds/planner/calibrate/packed_gpt.py",
    "src/mds/planner/calibrate/packed_vit.py",
    "src/mds/planner/calibrate/packed_hf.py",
    "src/mds/planner/calibrate/blocks.py",
    "src/mds/cli/calibrate.py",
}
# What the training side must never load, and what the planning side must never load.
NOT_IN_TRAINING = ("polars", "typer", "rich", "click", "mds.planner", "mds.cli")
NOT_IN_PLANNING = ("torch",)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(extras: tuple[str, ...]) -> set[str]:
    """Distribution names the core plus `extras` install (normalized); an extra that names
    the project's own extras (`all`) installs theirs."""
    names = set()
    for req in PROJECT["dependencies"] + [
        r for extra in extras for r in PROJECT["optional-dependencies"][extra]
    ]:
        name, extra_list = re.fullmatch(r"([A-Za-z0-9._-]+)(?:\[([\w,]+)\])?.*", req).groups()
        if _normalize(name) == _normalize(PROJECT["name"]):
            names |= declared(tuple(extra_list.split(",")))
        else:
            names.add(_normalize(name))
    return names


def imported_modules(folder: Path, skip: set[str] = frozenset()) -> dict[str, str]:
    """Top-level module -> first file importing it, over every import in `folder` (a folder
    or one file; but the files in `skip`), including those inside functions (the lazy ones),
    less subfolders that are sides of their own."""
    found: dict[str, str] = {}
    nested = [ROOT / side for side in SIDES if (ROOT / side).parent == folder]
    for path in sorted(folder.rglob("*.py")) if folder.is_dir() else [folder]:
        if str(path.relative_to(ROOT)) in skip or any(path.is_relative_to(n) for n in nested):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def test_every_extra_is_declared():
    extras = PROJECT["optional-dependencies"]
    assert {"plan", "train", "tokenizers", "vision", "all", "dev"} <= set(extras)
    assert declared(("all",)) == declared(("plan", "train", "tokenizers", "vision"))
    assert "torch" not in declared(("plan",)) and "polars" not in declared(("train",))


def test_torch_range_admits_the_pinned_cpu_build():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    pin = re.search(r"TORCH_PIN \?= torch==([\d.]+)", makefile).group(1)
    (spec,) = PROJECT["optional-dependencies"]["train"]
    low, high = re.fullmatch(r"torch>=([\d.]+),<=([\d.]+)", spec).groups()
    as_tuple = lambda v: tuple(int(x) for x in v.split("."))  # noqa: E731
    assert as_tuple(low) <= as_tuple(pin) <= as_tuple(high)


@pytest.mark.parametrize("folder", sorted(SIDES))
def test_every_import_is_a_declared_dependency(folder):
    providers = importlib.metadata.packages_distributions()
    allowed = declared(SIDES[folder])
    undeclared = {}
    for module, where in imported_modules(ROOT / folder, skip=TRAINING_FILES).items():
        if module in sys.stdlib_module_names or module in ("mds", "__future__"):
            continue
        dists = {_normalize(d) for d in providers.get(module, [module])}
        if not dists & allowed:
            undeclared[module] = where
    assert undeclared == {}, f"imported but not declared for {folder}/: {undeclared}"


def test_calibrate_needs_only_the_planning_and_training_extras():
    providers = importlib.metadata.packages_distributions()
    # `mds calibrate --hf-config` builds a transformers model: the `hf` extra
    allowed = declared(("plan", "train", "tokenizers", "hf"))
    for name in sorted(TRAINING_FILES):
        for module in imported_modules(ROOT / name):
            if module in sys.stdlib_module_names or module in ("mds", "__future__"):
                continue
            assert {_normalize(d) for d in providers.get(module, [module])} & allowed, module


# --- what each side loads at run time ------------------------------------------------------


def _run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _loaded(names: tuple[str, ...]) -> str:
    return (
        "import sys; print(sorted({m for m in sys.modules for n in "
        f"{names!r} if m == n or m.startswith(n + '.')}}))"
    )


@pytest.fixture(scope="module")
def sample_plan(tmp_path_factory) -> Path:
    index = sample_index(tmp_path_factory)
    plan = tmp_path_factory.mktemp("install") / "plan.mds"
    result = mds("plan", SAMPLE_CONFIG, "--index", index, "-o", plan, "--json")
    assert result.exit_code == 0, result.output
    return plan


def test_planning_never_imports_torch(tmp_path):
    """Every planning command, with torch made unimportable (None in sys.modules)."""
    t = tmp_path
    commands = [
        f"index {SAMPLE_CONFIG} -o {t}/index",
        f"plan {SAMPLE_CONFIG} --index {t}/index -o {t}/plan.mds",
        f"plan {SAMPLE_CONFIG} --index {t}/index -o {t}/plan2.mds --dp-size 2",
        f"export {t}/plan.mds -o {t}/plan.parquet",
        f"inspect {t}/index --files",
        f"inspect {t}/plan.mds --html {t}/report.html",
        f"inspect {t}/plan.mds --step 3",
        f"verify {t}/plan.mds --full",
        f"diff {t}/plan.mds {t}/plan2.mds",
    ]
    code = (
        "import shlex, sys; sys.modules['torch'] = None\n"
        "from mds.cli.main import app\n"
        f"for cmd in {commands!r}:\n"
        "    code = app(shlex.split(cmd), prog_name='mds', standalone_mode=False)\n"
        "    assert not code, (cmd, code)\n"
        "sys.modules.pop('torch')\n" + _loaded(NOT_IN_PLANNING)
    )
    assert _run(code).splitlines()[-1] == "[]"
    assert (t / "plan.parquet").is_file() and (t / "report.html").is_file()


def test_training_never_imports_polars_or_the_command_line(sample_plan):
    """A rank replays its slice (directly and through the DataLoader) without loading
    polars, typer, rich or the planner."""
    code = (
        "from tokenizers import Tokenizer\n"
        "from mds.executor import PlanExecutor, PlanLoader\n"
        "tok = Tokenizer.from_file('sample_data/tokenizer.json')\n"
        "tokenize = lambda text: tok.encode(text).ids\n"
        f"ex = PlanExecutor({str(sample_plan)!r}, 1, tokenize=tokenize, estimated='fit')\n"
        "batches = [mb for _, mb in zip(range(3), ex)]\n"
        "assert len(batches) == 3 and batches[0]['input_ids'].numel() > 0\n"
        "loaded = [mb for _, mb in zip(range(2), ex.dataloader(num_workers=0))]\n"
        "assert len(loaded) == 2\n" + _loaded(NOT_IN_TRAINING)
    )
    assert _run(code) == "[]"


def test_importing_the_executor_needs_no_torch():
    code = "import sys; sys.modules['torch'] = None; import mds, mds.executor; print('ok')"
    assert _run(code) == "ok"


# --- the built wheel in a clean venv -------------------------------------------------------


@pytest.mark.slow
def test_wheel_in_a_clean_venv(tmp_path):
    """Build the wheel; install it without extras (mds --help, import mds.executor, and a
    planning command says which extra it needs), then with `plan,tokenizers` (mds index
    and mds plan on sample_data/, with no torch installed). Dependencies come from the
    configured indexes, constrained to the versions the project is tested with."""
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}

    def run(*args, check=True):
        out = subprocess.run(
            [str(a) for a in args], capture_output=True, text=True, env=env, timeout=600
        )
        assert out.returncode == 0 or not check, out.stdout + out.stderr
        return out

    dist = tmp_path / "dist"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", dist, ROOT)
    (wheel,) = dist.glob("mds_planner-*.whl")
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    py, exe = venv / "bin" / "python", venv / "bin" / "mds"
    pip = (py, "-m", "pip", "install", "--quiet", "-c", ROOT / "constraints.txt")
    run(*pip, wheel)
    assert "Usage: mds" in run(exe, "--help").stdout
    assert run(py, "-m", "mds", "--version").stdout.startswith("mds ")
    code = (
        "import sys, mds.executor; import mds.core.planfile_reader; "
        "print(sorted(m for m in ('torch', 'polars') if m in sys.modules))"
    )
    assert run(py, "-c", code).stdout.strip() == "[]"
    typed = "import importlib.resources as r; print(r.files('mds').joinpath('py.typed').is_file())"
    assert run(py, "-c", typed).stdout == "True\n"
    missing = run(exe, "plan", SAMPLE_CONFIG, "-o", tmp_path / "p.mds", check=False)
    assert missing.returncode == 1
    assert "pip install '.[plan]' in the mds checkout" in missing.stderr
    run(*pip, f"{wheel}[plan,tokenizers]")
    run(exe, "index", SAMPLE_CONFIG, "-o", tmp_path / "index")
    run(exe, "plan", SAMPLE_CONFIG, "--index", tmp_path / "index", "-o", tmp_path / "plan.mds")
    assert run(py, "-c", "import importlib.util as u; print(u.find_spec('torch'))").stdout == (
        "None\n"
    )
