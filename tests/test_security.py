"""Security properties: no user file can make mds run code or read outside its data root.

1. Static: the product source (cli/, planner/, executor/) never deserializes with pickle-like
   modules, never evaluates strings as code and never starts a shell (checked on the AST).
2. Paths: every source path resolves inside the data root. `mds verify` refuses `../`,
   absolute and symlinked-out paths without reading them (tests/planner/report/test_verify_index.py:
   test_a_path_escaping_the_root_is_refused_and_never_read,
   test_escaping_megatron_index_path_is_refused, test_symlink_out_of_the_root_is_refused);
   `mds plan` refuses a manifest naming such a path, or a table symlinked out of the index,
   before writing anything; and the executor, which reads only the plan, refuses a file
   record forged into the plan (checksums recomputed) that leaves the root, in every verify
   mode. The outside file is a FIFO tripwire: any open of it, from Python or native code
   (pyarrow), is recorded.
3. Config expressions (`filter`, `[cost] expr`) go through Polars' SQL parser, never Python.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import mds, one_error_line
from executor_builders import open_executor, rewrite_plan, sample_plan
from fuzzing import Tripwire
from index_files import manifest_with_files, write_v1
from plan_builders import REPO, plan_config, synthetic, train_table

from mds.core.planfile import RankChunk
from mds.core.planfile_reader import PlanReader
from mds.errors import ConfigError, DataChangedError, PlanError

# --- 1. static checks of the product source ----------------------------------------------------

PRODUCT = ("src/mds",)
# Modules that deserialize to arbitrary objects, run code, or start processes with a shell.
FORBIDDEN_MODULES = {
    "pickle",
    "_pickle",
    "cPickle",
    "dill",
    "cloudpickle",
    "joblib",
    "marshal",
    "shelve",
    "subprocess",
    "pty",
    "code",
    "codeop",
    "runpy",
}
FORBIDDEN_BUILTINS = {"eval", "exec", "compile", "__import__", "breakpoint"}
FORBIDDEN_CALLS = {
    "os.system",
    "os.popen",
    "os.startfile",
    "yaml.load",
    "yaml.unsafe_load",
    "yaml.full_load",
    "torch.load",
    "torch.jit.load",
    "numpy.load",  # only with allow_pickle, see FORBIDDEN_KEYWORDS; listed to name it
    "importlib.import_module",
    "importlib.__import__",
    "builtins.eval",
    "builtins.exec",
    "torch.distributed.broadcast_object_list",  # unpickles what other ranks send
    "torch.distributed.all_gather_object",
    "torch.distributed.gather_object",
    "torch.distributed.scatter_object_list",
    "torch.distributed.recv_object_list",
}
FORBIDDEN_PREFIXES = ("os.exec", "os.spawn", "os.posix_spawn", "pickle.", "marshal.")
FORBIDDEN_KEYWORDS = {("shell", True), ("allow_pickle", True)}
# (file, what) -> why it is fine.
ALLOWED = {
    (
        "src/mds/executor/__init__.py",
        "importlib.import_module",
    ): "lazy import of our own modules, names from the fixed `_LAZY` table, never user input",
    (
        "src/mds/executor/moved.py",
        "importlib.import_module",
    ): "the new home of a moved module, from the fixed `MOVED` table, never user input",
    (
        "src/mds/planner/calibrate/fit.py",
        "importlib.import_module",
    ): "`mds calibrate --model module:function` runs the user's own model code on purpose, "
    "named on their command line as with `python -m`; never taken from a config, index or plan",
    (
        "src/mds/planner/plan/policy_callable.py",
        "importlib.import_module",
    ): "an online-mixing policy `package.module:function` is the user's own code, importable in "
    "their environment and named on purpose in their plan config (docs/online-mixing.md); "
    "never taken from an index, a plan or a signal log",
    (
        "src/mds/executor/online_segments.py",
        "import subprocess",
    ): "rank 0 runs `python -m mds plan` as an argument list (no shell) so planning stays out "
    "of the training process; its arguments are the run's own paths and numbers",
}
# numpy.load without allow_pickle=True cannot unpickle; only the keyword is forbidden.
HARMLESS_WITHOUT_KEYWORD = {"numpy.load"}


def product_files() -> list[Path]:
    files = sorted(p for d in PRODUCT for p in (REPO / d).rglob("*.py"))
    assert len(files) > 30, files
    return files


def aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted name it is bound to, from every import in the module."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def dotted(node: ast.AST, names: dict[str, str]) -> str | None:
    """`a.b.c` of a call's function, with import aliases resolved (`np` -> `numpy`)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([names.get(node.id, node.id), *reversed(parts)])


def findings(path: Path, base: Path = REPO) -> list[tuple[str, int, str]]:
    """(file, line, what) of every forbidden construct in one source file."""
    rel = path.relative_to(base).as_posix()
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
    names = aliases(tree)
    shadowed = {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for module in modules:
                if module.split(".")[0] in FORBIDDEN_MODULES:
                    out.append((rel, node.lineno, f"import {module}"))
        elif isinstance(node, ast.Call):
            name = dotted(node.func, names)
            keywords = {
                (k.arg, k.value.value) for k in node.keywords if isinstance(k.value, ast.Constant)
            }
            for arg, value in FORBIDDEN_KEYWORDS:
                if (arg, value) in keywords:
                    out.append((rel, node.lineno, f"{name}({arg}={value})"))
            if name is None:
                continue
            if (
                isinstance(node.func, ast.Name)
                and name in FORBIDDEN_BUILTINS
                and name not in shadowed
                and name not in names
            ):
                out.append((rel, node.lineno, f"{name}()"))
            elif (
                name in FORBIDDEN_CALLS and name not in HARMLESS_WITHOUT_KEYWORD
            ) or name.startswith(FORBIDDEN_PREFIXES):
                out.append((rel, node.lineno, name))
    return out


def test_the_static_check_catches_what_it_forbids(tmp_path):
    """The checker itself: every forbidden construct in a sample file is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pickle\nfrom subprocess import run\nimport os as o\nimport yaml, torch\n"
        "import numpy as np\nimport importlib\nfrom torch import distributed as dist\n"
        "eval('1')\nexec('x')\ncompile('1', 'f', 'eval')\n__import__('os')\n"
        "o.system('ls')\nrun('ls', shell=True)\nyaml.load(s)\ntorch.load(f)\n"
        "np.load(f, allow_pickle=True)\nimportlib.import_module(name)\no.execv('a', [])\n"
        "dist.broadcast_object_list(x)\nnp.load(f)\nre.compile('x')\n"
    )
    whats = [what for _, _, what in findings(bad, tmp_path)]
    assert whats.count("import pickle") == 1 and "import subprocess" in whats
    for what in ("eval()", "exec()", "compile()", "__import__()", "os.system", "yaml.load"):
        assert what in whats, (what, whats)
    for what in ("torch.load", "importlib.import_module", "os.execv"):
        assert what in whats, (what, whats)
    assert "torch.distributed.broadcast_object_list" in whats
    assert "subprocess.run(shell=True)" in whats and "numpy.load(allow_pickle=True)" in whats
    assert not any("re.compile" in w for w in whats) and whats.count("numpy.load") == 0


def test_no_code_execution_or_unsafe_deserialization_in_the_product():
    found = [f for path in product_files() for f in findings(path)]
    allowed = [f for f in found if (f[0], f[2]) in ALLOWED]
    assert [f for f in found if (f[0], f[2]) not in ALLOWED] == []
    assert {(f[0], f[2]) for f in allowed} == set(ALLOWED), "an allowlist entry is stale"


# --- 2. source paths stay inside the data root -------------------------------------------------


def spy_on_opens(monkeypatch, secret: Path) -> list[str]:
    """Record Python-level opens of `secret` (native opens are the tripwire's)."""
    seen: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def is_secret(file: Any) -> bool:
        try:
            return isinstance(file, str | os.PathLike) and Path(file).resolve() == secret.resolve()
        except (OSError, RuntimeError, ValueError):
            return False

    def spy_open(file, *args, **kwargs):
        if is_secret(file):
            seen.append(f"open({file!r})")
        return real_open(file, *args, **kwargs)

    def spy_os_open(file, *args, **kwargs):
        if is_secret(file):
            seen.append(f"os.open({file!r})")
        return real_os_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(io, "open", spy_open)
    monkeypatch.setattr(os, "open", spy_os_open)
    return seen


class Escape:
    """A copy of the sample data (mtimes kept) with symlinks out of it, a FIFO `secret`
    outside the copy for the symlinks to reach, and the sample plan and index to forge."""

    def __init__(self, base: Path, index: Path, plan: Path):
        self.base, self.plan, self.index = base, plan, index
        self.root = base / "data"
        shutil.copytree(REPO / "sample_data", self.root, copy_function=shutil.copy2)
        self.secret = base / "secret.parquet"
        os.mkfifo(self.secret)
        (base / "outside").mkdir()
        (self.root / "web" / "evil.parquet").symlink_to(self.secret)
        (self.root / "math" / "evil.idx").symlink_to(self.secret)
        (self.root / "out").symlink_to(base / "outside", target_is_directory=True)
        (base / "outside" / "web.parquet").symlink_to(self.secret)
        with open_executor(plan, 0) as ex:
            self.sources = ex.source_names
        self.manifest = manifest_with_files(index)

    def forge(self, change) -> Path:
        """A copy of the plan whose blocks' file records went through `change(sources, files)`
        and whose footer's data root is the copy, checksums recomputed: what refuses a path
        is the executor's own check of the plan's records."""

        def block(_c: int, _r: int, got: RankChunk) -> RankChunk:
            files = [(s, f, dict(entry)) for s, f, entry in got.fetch.files]
            change(self.sources, files)
            return dataclasses.replace(got, fetch=dataclasses.replace(got.fetch, files=files))

        def footer(data: dict[str, Any]) -> None:
            data["fetch"]["root"] = str(self.root)

        return rewrite_plan(self.plan, self.base / "forged.mds", block=block, footer=footer)

    def index_copy(self, directory: Path, change=None) -> Path:
        """A copy of the sample index in `directory`, its manifest through `change`."""
        index = directory / "index"
        shutil.copytree(self.index, index)
        manifest = json.loads(json.dumps(self.manifest))
        manifest["root"] = str(self.root)
        if change is not None:
            change(manifest)
        write_v1(index, manifest)  # file entries inline: a change can reach one
        return index


@pytest.fixture(scope="module")
def escape(tmp_path_factory) -> Escape:
    index, plan = sample_plan(tmp_path_factory)
    return Escape(tmp_path_factory.mktemp("escape"), index, plan)


def file_record(name: str, i: int, key: str, value: str):
    """A change of the file records: source `name`'s file `i` gets `key` = `value`."""

    def change(sources: list[str], files: list[tuple[int, int, dict[str, Any]]]) -> None:
        for s, f, entry in files:
            if sources[s] == name and f == i:
                entry[key] = value

    return change


def file_entry(name: str, i: int, key: str, value: str):
    """The same change of a manifest's file entry."""

    def change(manifest: dict[str, Any]) -> None:
        entry = next(s for s in manifest["sources"] if s["name"] == name)
        entry["files"][i][key] = value

    return change


def escaping_paths(escape: Escape) -> dict[str, tuple[str, int, str, str, str]]:
    """case -> (source, file, key, path, what the error says)."""
    secret = escape.secret
    return {
        "absolute": ("web", 1, "path", str(secret), "escapes the index root"),
        "dotdot": ("web", 1, "path", "../secret.parquet", "escapes the index root"),
        "inner dotdot": ("web", 1, "path", "web/../../secret.parquet", "escapes the index root"),
        "symlink out": ("web", 1, "path", "web/evil.parquet", "leads outside the index root"),
        "symlinked dir": ("web", 1, "path", "out/web.parquet", "leads outside the index root"),
        "megatron idx absolute": ("math", 0, "index_path", str(secret), "escapes the index root"),
        "megatron idx symlink": ("math", 0, "index_path", "math/evil.idx", "leads outside"),
        "jsonl dotdot": ("forum", 0, "path", "forum/../../secret.parquet", "escapes"),
    }


CASES = [
    "absolute",
    "dotdot",
    "inner dotdot",
    "symlink out",
    "symlinked dir",
    "megatron idx absolute",
    "megatron idx symlink",
    "jsonl dotdot",
]


def replay_all(plan: Path, verify: str = "stat") -> int:
    """Every micro-batch of rank 0 (file records are checked, or read, chunk by chunk)."""
    with open_executor(plan, 0, verify=verify) as ex:
        return sum(1 for _ in ex)


def test_the_forged_records_are_read_by_rank_0(escape):
    """Each case's file is read by rank 0 somewhere in the plan, so forging it is seen."""
    seen: set[tuple[str, int]] = set()

    def record(sources, files):
        seen.update((sources[s], f) for s, f, _ in files)

    with PlanReader(escape.plan) as reader:
        for c in range(len(reader.chunks)):
            record(escape.sources, reader.rank_chunk(c, 0).fetch.files)
    for name, i, *_ in escaping_paths(escape).values():
        assert (name, i) in seen, (name, i)


@pytest.mark.parametrize("verify", ["stat", "full", "none"])
@pytest.mark.parametrize("case", CASES)
def test_the_executor_refuses_a_path_leaving_the_root_and_never_opens_it(
    escape, monkeypatch, case, verify
):
    name, i, key, rel, says = escaping_paths(escape)[case]
    forged = escape.forge(file_record(name, i, key, rel))
    seen = spy_on_opens(monkeypatch, escape.secret)
    tripwire = Tripwire(escape.secret)
    try:
        # Checked as the chunk that reads the file is loaded; with "none", as it is read.
        error = PlanError if verify == "none" else DataChangedError
        with pytest.raises(error) as err:
            replay_all(forged, verify)
    finally:
        opened = tripwire.close()
    message = str(err.value)
    assert f"{name} files[{i}]: path {rel!r}" in message and says in message, message
    assert "refused, not read" in message and "\n" not in message
    assert not opened and seen == [], "the outside file was opened"


def test_the_forged_plan_is_otherwise_valid(escape):
    """The control: the same forging with a path inside the root replays."""
    forged = escape.forge(file_record("web", 1, "path", "web/part-00001.parquet"))
    with open_executor(forged, 0) as ex:
        batch = next(iter(ex))
        assert batch["step"] == 0 and len(batch["sample_id"]) > 0
    assert replay_all(forged, "full") > 0


def test_a_symlink_loop_in_the_root_is_refused(escape):
    """A path through a symlink loop: an MdsError naming it, not a RuntimeError."""
    loop = escape.root / "loop"
    if not loop.is_symlink():
        loop.symlink_to("loop")
    forged = escape.forge(file_record("web", 0, "path", "loop/part.parquet"))
    for verify, error in (("stat", DataChangedError), ("none", PlanError)):
        with pytest.raises(error, match="'loop/part.parquet' cannot be resolved"):
            replay_all(forged, verify)


@pytest.mark.parametrize("case", ["absolute", "dotdot", "inner dotdot", "jsonl dotdot"])
def test_mds_plan_refuses_a_manifest_with_a_path_leaving_the_root(escape, tmp_path, case):
    """`mds plan` reads the manifest first: it refuses the path before writing anything."""
    name, i, key, rel, _ = escaping_paths(escape)[case]
    index = escape.index_copy(tmp_path, file_entry(name, i, key, rel))
    out = tmp_path / "out"
    out.mkdir()
    result = mds(
        "plan", REPO / "sample_data" / "mds.toml", "-o", out / "plan.mds", "--index", index
    )
    one_error_line(result, f"{name} files[{i}]: path {rel!r} escapes the index root", "refused")
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("target", ["copy", "fifo"])
def test_mds_plan_refuses_a_table_symlinked_out_of_the_index(escape, tmp_path, monkeypatch, target):
    """The web table, moved out of the index (an intact copy, or the FIFO) and linked back
    in under a name inside it: `mds plan` refuses it before opening it."""
    web = next(s for s in escape.manifest["sources"] if s["name"] == "web")
    outside = tmp_path / "web-table.parquet"
    if target == "copy":
        shutil.copy2(escape.index / web["table"], outside)
    else:
        os.mkfifo(outside)

    def change(manifest):
        next(s for s in manifest["sources"] if s["name"] == "web")["table"] = "sources/evil.parquet"

    index = escape.index_copy(tmp_path, change)
    (index / "sources" / "evil.parquet").symlink_to(outside)
    out = tmp_path / "out"
    out.mkdir()
    seen = spy_on_opens(monkeypatch, outside)
    tripwire = Tripwire(outside) if target == "fifo" else None
    try:
        result = mds(
            "plan", REPO / "sample_data" / "mds.toml", "-o", out / "plan.mds", "--index", index
        )
    finally:
        opened = tripwire.close() if tripwire is not None else False
    one_error_line(result, "the table of source 'web'", "leaves the index directory", "refused")
    assert not opened and seen == [], "the outside table was opened"
    assert list(out.iterdir()) == []


# --- 3. config expressions are SQL, parsed by Polars -------------------------------------------


def plan_with(tmp_path: Path, *, filter: str | None = None, expr: str | None = None) -> None:
    source: dict[str, Any] = {"lengths": [5, 6, 7, 8] * 4, "weight": 1}
    if filter is not None:
        source["filter"] = filter
    data = synthetic(
        tmp_path,
        {"a": source},
        train_table(steps=2),
        cost={"expr": expr} if expr is not None else None,
    )
    from mds.planner.plan.build import build_plan

    build_plan(plan_config(tmp_path, data), tmp_path / "plan.mds")


INJECTIONS = [
    "__import__('os').system('touch {marker}')",
    "eval(\"__import__('os').system('touch {marker}')\")",
    "exec('import os; os.system(\"touch {marker}\")')",
    "1; DROP TABLE a",
    "n_tokens > 1; DROP TABLE a",
    "n_tokens > 1) OR (1 = 1",
    "`touch {marker}`",
    "$(touch {marker})",
]


@pytest.mark.parametrize("key", ["filter", "expr"])
@pytest.mark.parametrize("injection", INJECTIONS)
def test_config_expressions_are_not_python(tmp_path, key, injection):
    marker = tmp_path / "X"
    text = injection.format(marker=marker)
    with pytest.raises(ConfigError) as err:
        plan_with(tmp_path, **{key: text})
    assert key in str(err.value) and repr(text) in str(err.value)
    assert not marker.exists()
    assert not (tmp_path / "plan.mds").exists()


def test_a_plain_sql_filter_and_cost_still_work(tmp_path):
    plan_with(
        tmp_path,
        filter="n_tokens >= 6 AND n_tokens <> 7",
        expr="n_tokens + 0.5 * n_tokens * n_tokens",
    )
    assert (tmp_path / "plan.mds").is_file()


@pytest.mark.parametrize("key", ["filter", "expr"])
def test_config_expressions_cannot_read_files(tmp_path, key):
    secret = tmp_path / "secret.csv"
    text = f"n_tokens > (SELECT count(*) FROM read_csv('{secret}'))"
    tripwire = Tripwire(secret)
    try:
        with pytest.raises(ConfigError):
            plan_with(tmp_path, **{key: text})
    finally:
        opened = tripwire.close()
    assert not opened, "the expression opened a file"
    missing = f"n_tokens > (SELECT count(*) FROM read_csv('{tmp_path / 'nope.csv'}'))"
    with pytest.raises(ConfigError):
        plan_with(tmp_path, **{key: missing})
