"""The layer rule of docs/architecture.md, checked on the source with ``ast``.

Layers, bottom up: ``formulations`` <- ``mccl_opt`` (core) <- ``instances`` <-
``mccl_runtime`` <- ``executor_cuda``.  Imports only point down or sideways; no two
modules import each other, directly or through others (imports inside functions count,
``if TYPE_CHECKING:`` blocks do not).  The CLI package ``mccl_opt.cli`` is a leaf: no
other module imports it, and it imports the layers above the core only inside
functions.  A module over 400 lines says why at its top ("Longer than ~400 lines ...").

Run: ``pytest tests/architecture_check.py`` (docs/architecture.md says why it is not yet
collected by ``make test``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("formulations", "mccl_opt", "instances", "mccl_runtime", "executor_cuda")
CLI = "mccl_opt.cli"
MAX_LINES = 400
LONG_REASON = re.compile(r"Longer than ~?400 lines")


@dataclass(frozen=True)
class Edge:
    """``src`` imports ``dst`` at ``line``; ``in_function``: inside a def or lambda."""

    src: str
    dst: str
    line: int
    in_function: bool

    def __str__(self) -> str:
        where = " (in a function)" if self.in_function else ""
        return f"{self.src} -> {self.dst} (line {self.line}){where}"


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the layer packages under ``root``."""
    out = {}
    for pkg in LAYERS:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _targets(modules: dict[str, Path], module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The project modules an import statement loads (``from p import m`` names the
    module ``p.m`` when it is one, else the package ``p``)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".")
            if modules[module].name != "__init__.py":
                package = package[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    out = []
    for name in names:
        while name and name not in modules:          # "import a.b.c" of a name inside a module
            name = name.rpartition(".")[0]
        if name and name.split(".")[0] in LAYERS:
            out.append(name)
    return out


def import_edges(modules: dict[str, Path]) -> dict[str, list[Edge]]:
    """Every module's imports of other project modules (``TYPE_CHECKING`` blocks skipped)."""
    def edges_of(module: str) -> list[Edge]:
        edges: list[Edge] = []

        def walk(node: ast.AST, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _is_type_checking(child.test):
                    for stmt in child.orelse:
                        walk(stmt, in_function)
                    continue
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    edges.extend(Edge(module, t, child.lineno, in_function)
                                 for t in _targets(modules, module, child) if t != module)
                walk(child, in_function or isinstance(
                    child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        walk(ast.parse(modules[module].read_text(), str(modules[module])), False)
        return edges

    return {m: edges_of(m) for m in modules}


def _is_cli(module: str) -> bool:
    """The CLI package, and ``python -m mccl_opt`` (an entry point like the console script)."""
    return module == CLI or module.startswith(CLI + ".") or module == "mccl_opt.__main__"


def _layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def cycles(edges: dict[str, list[Edge]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    graph = {m: sorted({e.dst for e in out}) for m, out in edges.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def cycle_problems(edges: dict[str, list[Edge]]) -> list[str]:
    out = []
    for comp in cycles(edges):
        inside = set(comp)
        lines = list(dict.fromkeys(str(e) for m in comp for e in edges[m] if e.dst in inside))
        out.append(f"cycle between {', '.join(comp)}:\n      " + "\n      ".join(lines))
    return out


def upward_imports(edges: dict[str, list[Edge]]) -> list[str]:
    return [str(e) for m, out in edges.items() if not _is_cli(m) for e in out
            if not _is_cli(e.dst) and _layer(e.dst) > _layer(m)]


MODULES = module_files(ROOT)
EDGES = import_edges(MODULES)


def test_the_checks_catch_what_they_are_for(tmp_path):
    """On a made-up tree: a cycle through a function-level import and an upward import
    are found; a ``TYPE_CHECKING`` import is not an edge."""
    files = {
        "formulations/__init__.py": "",
        "formulations/a.py": "from mccl_opt import b\n",                     # up a layer
        "mccl_opt/__init__.py": "",
        "mccl_opt/b.py": "def f():\n    from .c import g\n",
        "mccl_opt/c.py": "from . import b\n",                               # b <-> c
        "mccl_opt/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                         "    from .e import x\n",
        "mccl_opt/e.py": "from .d import y\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    edges = import_edges(module_files(tmp_path))
    assert cycles(edges) == [["mccl_opt.b", "mccl_opt.c"]]
    assert upward_imports(edges) == ["formulations.a -> mccl_opt.b (line 1)"]
    assert [str(e) for e in edges["mccl_opt.b"]] == ["mccl_opt.b -> mccl_opt.c (line 2) (in a function)"]
    assert edges["mccl_opt.d"] == []


def test_the_walker_sees_the_package():
    # guards the checks below against passing on an empty or misread tree
    assert {"mccl_opt.topology", "mccl_opt.alltoall.solve", "formulations.lp", CLI} <= set(MODULES)
    assert "mccl_opt.topology" in {e.dst for e in EDGES["mccl_opt.alltoall.solve"]}


def test_no_import_cycles():
    problems = cycle_problems(EDGES)
    assert not problems, ("modules import each other; move the shared part into its own "
                          "module both can import:\n  " + "\n  ".join(problems))


def test_imports_point_down_the_layers():
    up = upward_imports(EDGES)
    assert not up, (f"imports that point up the layers {' <- '.join(LAYERS)}:\n  "
                    + "\n  ".join(up))


def test_the_cli_is_a_leaf():
    into = [str(e) for m in MODULES if not _is_cli(m) for e in EDGES[m] if _is_cli(e.dst)]
    assert not into, "modules outside the CLI import it:\n  " + "\n  ".join(into)
    core = LAYERS.index("mccl_opt")
    eager = [str(e) for m in MODULES if _is_cli(m) for e in EDGES[m]
             if not e.in_function and not _is_cli(e.dst) and _layer(e.dst) > core]
    assert not eager, ("the CLI imports upper layers at module level (import them inside the "
                       "command function):\n  " + "\n  ".join(eager))


def test_long_modules_say_why():
    unexplained = []
    for module, path in sorted(MODULES.items()):
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_LINES and not LONG_REASON.search(ast.get_docstring(ast.parse(text)) or ""):
            unexplained.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert not unexplained, (
        "modules over 400 lines without a reason: split them, or say at the top why each is "
        "one module ('Longer than ~400 lines on purpose: ...' in the module docstring):\n  "
        + "\n  ".join(unexplained))


#: ``Schedule.stats`` is a JSON view: code decides on ``Schedule.report`` (issue 28).  A
#: read of a schedule's stats (``x.stats[...]`` not assigned, ``x.stats.get(...)``) may
#: appear only in the CLI (printing) and here, where one JSON view is copied into another.
STATS_READ = re.compile(r"\.stats\.get\(|\.stats\[[^\]]+\](?!\s*[+\-]?=)")
STATS_COPIES = {"mccl_opt/allgather/assemble.py"}


def _stats_reads(root: Path) -> list[str]:
    out = []
    for pkg in ("mccl_opt", "mccl_runtime", "executor_cuda"):
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith("mccl_opt/cli/") or rel in STATS_COPIES:
                continue
            for no, line in enumerate(path.read_text().splitlines(), 1):
                if STATS_READ.search(line.replace("run.stats", "")):
                    out.append(f"{rel}:{no}: {line.strip()}")
    return out


def test_no_control_flow_on_stats():
    assert _stats_reads(ROOT) == [], "decide on Schedule.report, not on the stats JSON view"


def test_the_stats_check_catches_a_read(tmp_path):
    bad = tmp_path / "mccl_opt" / "m.py"
    bad.parent.mkdir()
    bad.write_text("if sched.stats.get('k') is None:\n    x = s.stats['k']\ns.stats['k'] = 1\n")
    assert len(_stats_reads(tmp_path)) == 2
