"""docs/allgather.md's design part names only code that exists, and its links resolve.

The design sections (everything above *Findings since the restructure*) name modules
(``forestcoll/pack_plan.py``), module members (``budget.EXACT_TREES_LIMIT``,
``chain.weaker_directions``), constants (``WARM_SHARE``) and classes with members
(``WarmRoute.attempt``).  A rename in the code that the design does not follow fails
here; so does a link into docs/allgather_history.md whose section is gone.  The names
are read from the sources' syntax trees (no import).
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: where a short module path in the design is looked up, in order
BASES = [ROOT, ROOT / "mccl_opt", ROOT / "mccl_opt" / "allgather",
         ROOT / "mccl_opt" / "allgather" / "forestcoll"]
DESIGN_END = "## Findings since the restructure"
CODE = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"^([A-Za-z_][\w/]*)\.([A-Za-z_]\w*)$")


def design_text() -> str:
    text = (DOCS / "allgather.md").read_text()
    assert DESIGN_END in text, "the design part ends at the appended findings' heading"
    return text.split(DESIGN_END)[0]


def module_file(path: str) -> Path | None:
    """``forestcoll/pack_plan.py``, ``pack_plan`` or ``mccl_opt.report`` as a source file."""
    rel = path.replace(".", "/") if "/" not in path and path.count(".") and \
        not path.endswith(".py") else path
    rel = rel if rel.endswith(".py") else rel + ".py"
    for base in BASES:
        for cand in (base / rel, base / rel[:-3] / "__init__.py"):
            if cand.is_file():
                return cand
    hits = sorted((ROOT / "mccl_opt").rglob(Path(rel).name))
    return hits[0] if len(hits) == 1 and "/" not in rel else None


@lru_cache(maxsize=None)
def members(file: Path) -> frozenset[str]:
    """Top-level names a module defines (functions, classes, assignments, imports)."""
    names: set[str] = set()
    for node in ast.parse(file.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


@lru_cache(maxsize=None)
def classes() -> dict[str, set[str]]:
    """Every class of the packages, with its methods, fields and enum members."""
    found: dict[str, set[str]] = {}
    for pkg in ("mccl_opt", "mccl_runtime"):
        for file in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(file.read_text())):
                if isinstance(node, ast.ClassDef):
                    own = found.setdefault(node.name, set())
                    for item in node.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            own.add(item.name)
                        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                            own.add(item.target.id)
                        elif isinstance(item, ast.Assign):
                            own.update(t.id for t in item.targets if isinstance(t, ast.Name))
    return found


@lru_cache(maxsize=None)
def constants() -> frozenset[str]:
    """Upper-case names: module constants and class-level ones (enum members)."""
    top = {name for file in (ROOT / "mccl_opt").rglob("*.py") for name in members(file)}
    nested = {name for own in classes().values() for name in own}
    return frozenset(name for name in top | nested if name.isupper())


def class_members(file: Path) -> set[str]:
    """The members of every class ``file`` defines (a report's fields, say)."""
    return {name for node in ast.parse(file.read_text()).body if isinstance(node, ast.ClassDef)
            for name in classes().get(node.name, ())}


def check_name(token: str) -> str | None:
    """Why ``token`` (the text of one code span) names nothing, or ``None``."""
    token = token.rstrip("()")
    if re.search(r"\s", token):
        return None                           # a command line or an expression
    if token.endswith(".py"):
        return None if module_file(token) else f"no module {token}"
    m = DOTTED.match(token)
    if m is None:
        if re.fullmatch(r"[A-Z][A-Z0-9_]{3,}", token):
            return None if token in constants() else f"no constant {token}"
        return None
    owner, name = m.groups()
    if owner in classes():
        return None if name in classes()[owner] else f"{owner} has no {name}"
    file = module_file(owner)
    if file is None:
        return None if "/" not in owner else f"no module {owner}"
    if name in members(file) or name in class_members(file) or module_file(f"{owner}/{name}"):
        return None
    return f"{file.relative_to(ROOT)} has no {name}"


def slugs(text: str) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"^#+ (.*)$", line)
        if m:
            s = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def test_every_name_in_the_design_exists():
    bad = sorted({why for token in CODE.findall(design_text())
                  if (why := check_name(token)) is not None})
    assert not bad, "docs/allgather.md names what the code no longer has: " + "; ".join(bad)


def test_every_link_of_the_design_resolves():
    text = (DOCS / "allgather.md").read_text()
    anchors = {"allgather.md": slugs(text),
               "allgather_history.md": slugs((DOCS / "allgather_history.md").read_text())}
    bad = []
    for target, anchor in re.findall(r"\]\(((?:allgather(?:_history)?\.md)?)#([^)]+)\)", text):
        if anchor not in anchors[target or "allgather.md"]:
            bad.append(f"{target or 'allgather.md'}#{anchor}")
    assert not bad, f"links to no heading: {bad}"


def test_the_checks_catch_a_stale_name():
    assert check_name("forestcoll/pack_plan.py") is None
    assert check_name("budget.EXACT_TREES_LIMIT") is None
    assert check_name("WarmRoute.attempt") is None
    assert check_name("forestcoll/no_such_module.py") is not None
    assert check_name("budget.NO_SUCH_LIMIT") is not None
    assert check_name("WarmRoute.no_such_method") is not None
    assert check_name("NO_SUCH_CONSTANT") is not None
