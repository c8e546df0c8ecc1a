"""The package's structure, read from its source with ``ast``: no import cycle (function-level
imports included), the import rules of ``docs/architecture.md``'s table, and no function over 80
lines."""

from __future__ import annotations

import ast
import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "neurarch_trace"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

#: Longest function or method allowed, in lines (``end_lineno - lineno + 1``).
MAX_FUNCTION_LINES = 80

#: Cycles being removed elsewhere: the edges among these modules are not checked. Issue 12 (the
#: anywidget front end) separates the notebook's rendering from its widget (``widget`` imports
#: ``result``'s helpers, ``result`` imports ``widget`` back through the package) and removes this
#: one; drop it from here at that merge.
KNOWN_CYCLES: List[Set[str]] = []


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> Dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(body: List[ast.stmt], top: bool) -> Iterator[Tuple[ast.stmt, bool]]:
    """Every import statement under ``body`` with whether it runs at module level; the bodies of
    ``if TYPE_CHECKING:`` are skipped (they never run)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, top
        elif isinstance(node, ast.If) and _is_type_checking(node):
            yield from _import_nodes(node.orelse, top)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _import_nodes(getattr(node, "body", []), False)
        elif isinstance(node, ast.ClassDef):
            yield from _import_nodes(node.body, top)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                yield from _import_nodes(getattr(node, field, []) or [], top)


def _resolve(module: str, is_package: bool, node: ast.stmt) -> Iterator[str]:
    """Absolute names an import statement loads: project modules (the deepest one each name
    reaches) and external top-level packages. ``from P import x`` loads ``P`` itself (its
    ``__init__`` runs) and ``P.x`` when that is a module; ``import P.Q`` loads ``P.Q``. The parent
    packages Python also initialises on the way are left out: a package that imports its own
    submodules would otherwise always be a cycle."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        assert isinstance(node, ast.ImportFrom)
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([base] if base else []))
        names = [base] + [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES]
    for name in names:
        if name.split(".")[0] != "neurarch_trace":
            yield name.split(".")[0]
            continue
        while name not in MODULES and "." in name:
            name = name.rsplit(".", 1)[0]
        yield name


def _graph() -> Tuple[Dict[str, Set[str]], Dict[str, Set[str]]]:
    """``(every import, top-level imports)``: module -> what it imports (project modules and
    external top-level packages)."""
    every: Dict[str, Set[str]] = {}
    top: Dict[str, Set[str]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        every[module], top[module] = set(), set()
        for node, at_top in _import_nodes(tree.body, True):
            for name in _resolve(module, path.name == "__init__.py", node):
                if name != module:
                    every[module].add(name)
                    if at_top:
                        top[module].add(name)
    return every, top


EVERY, TOP = _graph()


def test_the_graph_sees_function_level_imports() -> None:
    # the parser must see what the rules are about: a lazy import inside a function
    assert "neurarch_trace.tracer" in EVERY["neurarch_trace"]
    assert "neurarch_trace.tracer" not in TOP["neurarch_trace"]
    assert "torch" in EVERY["neurarch_trace.trace.recorder"]
    assert "neurarch_trace.trace.recorder" not in EVERY["neurarch_trace.trace.provenance"]  # TYPE_CHECKING only


def test_no_import_cycle() -> None:
    internal = {m: {d for d in deps if d in MODULES} for m, deps in EVERY.items()}
    for cycle in KNOWN_CYCLES:
        for module in cycle:
            internal[module] -= cycle
    try:
        TopologicalSorter(internal).prepare()
    except CycleError as err:
        pytest.fail(f"import cycle: {' -> '.join(err.args[1])}")


def _rules() -> List[Tuple[List[str], Set[str], Set[str]]]:
    """The rows of the table in docs/architecture.md: ``(modules, may import, never imports)``."""
    rows = []
    in_table = False
    for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines():
        if line.startswith("| modules |"):
            in_table = True
            continue
        if in_table and line.startswith("|---"):
            continue
        if in_table and not line.startswith("|"):
            break
        if in_table:
            cells = [c.strip() for c in line.strip("|").split("|")]
            modules = re.findall(r"`([^`]+)`", cells[0])
            may = {m.strip() for m in cells[2].split(",") if m.strip() and m.strip() != "(nothing)"}
            never = {m.strip() for m in cells[3].split(",") if m.strip()}
            rows.append((modules, may, never))
    assert rows, "no import-rule table in docs/architecture.md"
    return rows


RULES = _rules()


def _row(module: str) -> Tuple[str, Set[str], Set[str]]:
    rel = module[len("neurarch_trace."):] if module != "neurarch_trace" else "__init__"
    for names, may, never in RULES:
        for name in names:
            if rel == name or rel.startswith(name + "."):
                return name, may, never
    raise AssertionError(f"{module} is in no row of the table in docs/architecture.md")


def _loads(module: str) -> Set[str]:
    """Everything importing ``module`` loads: its top-level imports, transitively."""
    seen: Set[str] = set()
    todo = [module]
    while todo:
        for name in TOP.get(todo.pop(), ()):
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


@pytest.mark.parametrize("module", sorted(MODULES))
def test_import_rules_of_the_architecture_table(module: str) -> None:
    row, may, never = _row(module)
    own = row.split(".")[0]
    wrong = []
    for name in sorted(EVERY[module]):
        if name in MODULES:
            first = name[len("neurarch_trace."):].split(".")[0] if name != "neurarch_trace" else "__init__"
            if first != own and first not in may:
                wrong.append(f"imports {name}, which its row ({row}) does not allow")
    external = {n for n in EVERY[module] if n not in MODULES} | {n for n in _loads(module) if n not in MODULES}
    banned = external & never
    if banned:
        wrong.append(f"imports {sorted(banned)}, which its row ({row}) never imports")
    assert not wrong, f"{module} " + "; ".join(wrong)


def _functions() -> Iterator[Tuple[str, str, int]]:
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield module, node.name, node.end_lineno - node.lineno + 1


def test_no_function_over_80_lines() -> None:
    long = [f"{m}.{name} ({n} lines)" for m, name, n in _functions() if n > MAX_FUNCTION_LINES]
    assert not long, "functions over 80 lines: " + ", ".join(long)
