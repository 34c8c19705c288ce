"""A project import inside a function hides a dependency from the layer contracts' reader and
costs a lookup per call: it stays only where laziness is the point (a subcommand, an optional
extra, torch off a torch-free path), and says so in a `# lazy: <reason>` line right above it (or
above the run of import statements it belongs to)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "agent" / "laps_agent", ROOT / "operator" / "laps_operator"]
PROJECT = ("laps_agent", "laps_operator")


def _is_project_import(node: ast.stmt) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").startswith(PROJECT)
    return isinstance(node, ast.Import) and any(a.name.startswith(PROJECT) for a in node.names)


def _runs_of_imports(statements: list[ast.stmt]):
    """Each project import with the first statement of the run of imports it stands in."""
    first = None
    for stmt in statements:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            first = first or stmt
            if _is_project_import(stmt):
                yield stmt, first
        else:
            first = None


def _function_local_project_imports(tree: ast.Module):
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            for name in ("body", "orelse", "finalbody"):
                block = getattr(node, name, None)
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                    yield from _runs_of_imports(block)


def test_every_function_local_project_import_says_why_it_is_lazy():
    unexplained = set()
    for source in SOURCES:
        for path in sorted(source.rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            lines = text.splitlines()
            for node, first in _function_local_project_imports(ast.parse(text)):
                above = lines[first.lineno - 2].strip() if first.lineno >= 2 else ""
                if not above.startswith("# lazy:"):
                    unexplained.add(f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not unexplained, ("function-local project imports without a '# lazy: <reason>' line above "
                             "(hoist them, or say why they must wait):\n" + "\n".join(sorted(unexplained)))
