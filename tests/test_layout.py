"""The package's import graph, read from the source with `ast`: no cycles between modules
or between folders, planner and executor never import each other, the shared base (errors,
core, formats) imports nothing above it, and no module reaches another's private names.

`python tests/test_layout.py` prints the folder graph with edge counts.

Imports under `if TYPE_CHECKING:` are left out (they never run); imports inside functions
count, since they run when the function does.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter, defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Which folders each folder may import (besides itself). The order is the layering:
# errors <- core <- formats <- {planner rooms, executor} <- cli <- mds (the entry points).
ALLOWED = {
    "mds.errors": set(),
    "mds.core": {"mds.errors"},
    "mds.formats": {"mds.errors", "mds.core", "mds.formats.parquet"},
    "mds.formats.parquet": {"mds.errors", "mds.core"},
    "mds.planner.runtime": {"mds.errors", "mds.core"},
    "mds.planner.index": {
        "mds.errors", "mds.core", "mds.formats", "mds.formats.parquet", "mds.planner.runtime",
    },
    "mds.planner.plan": {
        "mds.errors", "mds.core", "mds.formats", "mds.planner.runtime", "mds.planner.index",
    },
    "mds.planner.report": {
        "mds.errors", "mds.core", "mds.formats", "mds.planner.runtime", "mds.planner.index",
        "mds.planner.plan",
    },
    "mds.planner.calibrate": {"mds.errors", "mds.core"},
    "mds.planner": set(),
    "mds.executor.readers": {"mds.errors", "mds.core", "mds.formats", "mds.formats.parquet"},
    "mds.executor.catalog": {"mds.errors", "mds.core", "mds.formats", "mds.executor.readers"},
    "mds.executor": {
        "mds.errors", "mds.core", "mds.formats", "mds.executor.catalog", "mds.executor.readers",
    },
    "mds.executor.integrations": {"mds.errors", "mds.core", "mds.executor"},
    # the catalog: to read planned samples' contents as training does (mds trace)
    "mds.cli": {
        "mds", "mds.errors", "mds.core", "mds.planner.runtime", "mds.planner.index",
        "mds.planner.plan", "mds.planner.report", "mds.planner.calibrate",
        "mds.executor.catalog",
    },
    "mds": set(),
    "mds.__main__": {"mds.cli"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def folder(name: str, mods: dict[str, Path]) -> str:
    """The folder a module lives in; the top-level modules (`mds`, `mds.errors`,
    `mds.__main__`) each stand alone, since they sit at opposite ends of the layering."""
    if name.count(".") <= 1:
        return name
    if mods[name].name == "__init__.py":
        return name
    return name.rpartition(".")[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _walk(tree: ast.AST):
    """ast.walk, less the bodies of `if TYPE_CHECKING:`."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if _type_checking(node):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


class Graph:
    """Module -> the mds modules it imports, plus every private name it reaches."""

    def __init__(self) -> None:
        self.mods = modules()
        self.edges: dict[str, set[str]] = defaultdict(set)
        self.private: list[str] = []
        for name, path in self.mods.items():
            self._read(name, path)

    def _target(self, mod: str, attr: str | None) -> str | None:
        full = f"{mod}.{attr}" if attr else mod
        if full in self.mods:
            return full
        return mod if mod in self.mods else None

    def _read(self, name: str, path: Path) -> None:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        aliases: dict[str, str] = {}
        for node in _walk(tree):
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    mod = ".".join(base + ([mod] if mod else []))
                if mod != "mds" and not mod.startswith("mds."):
                    continue
                for alias in node.names:
                    target = self._target(mod, alias.name)
                    if target is None:
                        continue
                    self.edges[name].add(target)
                    if target == f"{mod}.{alias.name}":
                        aliases[alias.asname or alias.name] = target
                    elif _private(alias.name) and target != name:
                        self.private.append(f"{name} imports {alias.name} from {target}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("mds.") and alias.name in self.mods:
                        self.edges[name].add(alias.name)
                        if alias.asname:
                            aliases[alias.asname] = alias.name
        for node in _walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and _private(node.attr)
                and aliases[node.value.id] != name
            ):
                self.private.append(f"{name} uses {aliases[node.value.id]}.{node.attr}")
        self.edges[name].discard(name)

    def folder_edges(self) -> Counter:
        counts: Counter = Counter()
        for src, targets in self.edges.items():
            for dst in targets:
                a, b = folder(src, self.mods), folder(dst, self.mods)
                if a != b:
                    counts[(a, b)] += 1
        return counts


def cycles(nodes: set[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in nodes:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        comp.append(top)
                        if top == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def render(graph: Graph) -> str:
    per_folder = Counter(folder(m, graph.mods) for m in graph.mods)
    lines = [f"{len(graph.mods)} modules"]
    out: dict[str, list[str]] = defaultdict(list)
    for (a, b), n in sorted(graph.folder_edges().items()):
        out[a].append(f"{b} ({n})")
    for f in sorted(per_folder):
        lines.append(f"{f} [{per_folder[f]} modules] -> {', '.join(out[f]) or '-'}")
    return "\n".join(lines)


GRAPH = Graph()


def test_the_graph_is_read_whole():
    assert len(GRAPH.mods) > 80
    assert "mds.errors" in GRAPH.edges["mds.core.storage"]


def test_no_module_cycles():
    assert cycles(set(GRAPH.mods), GRAPH.edges) == []


def test_no_folder_cycles():
    edges: dict[str, set[str]] = defaultdict(set)
    for a, b in GRAPH.folder_edges():
        edges[a].add(b)
    assert cycles({f for pair in GRAPH.folder_edges() for f in pair}, edges) == []


def test_every_folder_imports_only_what_it_stands_on():
    wrong = [
        f"{a} -> {b} ({n} imports)"
        for (a, b), n in sorted(GRAPH.folder_edges().items())
        if b not in ALLOWED.get(a, set())
    ]
    assert wrong == [], "\n" + render(GRAPH)


def test_planner_and_executor_are_siblings():
    crossing = [
        f"{src} -> {dst}"
        for src, targets in GRAPH.edges.items()
        for dst in targets
        for a, b in (("mds.planner", "mds.executor"), ("mds.executor", "mds.planner"))
        if src.startswith(a) and dst.startswith(b)
    ]
    assert crossing == []


def test_no_private_reach_across_modules():
    assert GRAPH.private == []


def test_every_folder_is_in_the_layering():
    folders = {folder(m, GRAPH.mods) for m in GRAPH.mods}
    assert folders <= set(ALLOWED), folders - set(ALLOWED)


# Test folders that are not about one package folder: whole-system checks.
NOT_MIRRORS = {"faults", "examples", "sample_data", "golden"}


def test_tests_mirror_the_package():
    """Every test folder is a package folder's mirror (tests/core for src/mds/core, ...)."""
    tests = Path(__file__).resolve().parent
    folders = {
        p.parent.relative_to(tests) for p in tests.rglob("test_*.py") if p.parent != tests
    }
    strays = [
        str(f) for f in sorted(folders)
        if f.parts[0] not in NOT_MIRRORS and not (SRC / "mds" / f).is_dir()
    ]
    assert strays == []


def test_the_checks_catch_what_they_look_for(tmp_path):
    """A cycle, a private import and a TYPE_CHECKING import, on a toy graph."""
    assert cycles({"a", "b", "c"}, {"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a", "b"}, {"a": {"b"}}) == []
    tree = ast.parse("if TYPE_CHECKING:\n    import x\nimport y\n")
    names = [a.name for n in _walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert names == ["y"]


if __name__ == "__main__":
    print(render(GRAPH))
    if GRAPH.private:
        print("private reaches:", *GRAPH.private, sep="\n  ")
    found = cycles(set(GRAPH.mods), GRAPH.edges)
    if found:
        print("cycles:", *found, sep="\n  ")
    sys.exit(1 if GRAPH.private or found else 0)
