"""PostgreSQL never sees SQL built from values: every SQL text in the package is a constant, or an f-string
whose holes are module constants (column lists, the fence) filled with other constants. Values go in
bound parameters only. This test reads the source, so a new query that breaks the rule fails here."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = [ROOT / "worker", ROOT / "operator"]
# Statement shapes, not lone keywords, so prose that mentions "INSERT … ON CONFLICT" is not taken for SQL.
SQL = re.compile(
    r"\bSELECT\b.*\bFROM\b|\bSELECT\s+\S+\s*$|\bINSERT\s+INTO\b|\bUPDATE\s+\w+\s+SET\b|\bDELETE\s+FROM\b|"
    r"\b(CREATE|DROP|ALTER)\s+(TABLE|INDEX|ROLE|DATABASE|FUNCTION|TRIGGER)\b|\bGRANT\b|\bTRUNCATE\b|\bWHERE\b.*=",
    re.DOTALL,
)
CONSTANT = re.compile(r"^[A-Z][A-Z0-9_]*$")


def _sql_text(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return bool(SQL.search(node.value))
    if isinstance(node, ast.JoinedStr):  # the literal parts together, the holes as placeholders
        return bool(SQL.search("".join(v.value if isinstance(v, ast.Constant) else " x " for v in node.values)))
    return False


def _constant_locals(func: ast.AST | None) -> set[str]:
    """Names that the enclosing function binds only to string constants."""
    if func is None:
        return set()
    bound: dict[str, bool] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    ok = isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                    bound[target.id] = bound.get(target.id, True) and ok
    return {name for name, ok in bound.items() if ok}


def _hole_ok(expr: ast.expr, constants: set[str]) -> bool:
    if isinstance(expr, ast.Name):
        return bool(CONSTANT.match(expr.id))
    if (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "format"
            and isinstance(expr.func.value, ast.Name) and CONSTANT.match(expr.func.value.id)):
        return not expr.args and all(
            (isinstance(k.value, ast.Name) and k.value.id in constants)
            or (isinstance(k.value, ast.Constant) and isinstance(k.value.value, str))
            for k in expr.keywords
        )
    return False


def violations(source: str, filename: str = "<source>") -> Iterator[str]:
    tree = ast.parse(source, filename)
    parents: dict[ast.AST, ast.AST] = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def enclosing_function(node: ast.AST) -> ast.AST | None:
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node
        return None

    for node in ast.walk(tree):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.JoinedStr) and _sql_text(node):
            constants = _constant_locals(enclosing_function(node))
            for hole in (v for v in node.values if isinstance(v, ast.FormattedValue)):
                if not _hole_ok(hole.value, constants):
                    yield f"{where}: SQL f-string interpolates {ast.unparse(hole.value)}"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Add)) and (
            _sql_text(node.left) or _sql_text(node.right)
        ):
            yield f"{where}: SQL built with an operator: {ast.unparse(node)[:80]}"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"
              and _sql_text(node.func.value)):
            yield f"{where}: SQL built with str.format: {ast.unparse(node)[:80]}"


def test_the_package_builds_sql_only_from_constants() -> None:
    found = [v for d in PACKAGE_DIRS for p in sorted(d.rglob("*.py")) for v in violations(p.read_text(), str(p.relative_to(ROOT)))]
    assert found == []


def test_the_guard_catches_values_in_sql() -> None:
    bad = '''
def f(run_id, name):
    cur.execute(f"SELECT * FROM run WHERE id = '{run_id}'")
    cur.execute("DELETE FROM run WHERE name = '%s'" % name)
    cur.execute("UPDATE run SET x = 1 WHERE id = " + run_id)
    cur.execute("SELECT {}".format(name))
    extra = name
    cur.execute(f"UPDATE run SET {FENCE.format(extra=extra)}")
'''
    assert len(list(violations(bad))) == 5
    good = '''
COLUMNS = "a, b"
def f(run_id):
    extra = ", c = 1"
    cur.execute(f"SELECT {COLUMNS} FROM run WHERE id = %s {FENCE.format(extra=extra)}", (run_id,))
'''
    assert list(violations(good)) == []


def test_the_guard_sees_the_store_queries() -> None:
    """The shapes above must recognise the real queries, or the first test proves nothing."""
    trees = [ast.parse(p.read_text()) for p in (ROOT / "worker" / "store").glob("*.py")]
    seen = sum(1 for t in trees for n in ast.walk(t) if isinstance(n, (ast.Constant, ast.JoinedStr)) and _sql_text(n))
    assert seen >= 12
