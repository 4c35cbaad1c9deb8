"""One door to the database: no SQL outside worker/store/ (and its migrations), the operator's included.

A tool's own tables are the tool's business: the demo's tickets tool keeps its statements. Everything
else that talks to PostgreSQL asks the store. Two ways to notice a statement elsewhere: a string that
reads as SQL, and a call of `execute` on a connection or cursor.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / "worker" / "store"
TOOLS_OWN_TABLES = {ROOT / "worker" / "demo" / "tickets.py": "the demo's tickets tool and its acme_ticket table"}

SQL = re.compile(
    r"\bSELECT\b[\s\S]*\bFROM\b|\bSELECT\s+(1|pg_\w+|\w+\()|\bINSERT\s+INTO\b|\bUPDATE\s+\w+\s+SET\b|"
    r"\bDELETE\s+FROM\b|^\s*(LISTEN|NOTIFY|UNLISTEN)\s|\bpg_notify\s*\(|\bpg_(try_)?advisory",
    re.MULTILINE,
)
EXECUTES = {"execute", "executemany", "copy"}
DATABASE_HANDLE = re.compile(r"conn|cur|db|pg|session", re.IGNORECASE)
"""What a connection or cursor is called (a tool box's `execute` runs a tool, not a statement)."""


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return _name(node.func)
    return ""


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (prose may name SQL words)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def statements_outside_the_store(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and id(node) not in docs:
            text = node.value.decode(errors="replace") if isinstance(node.value, bytes) else node.value
            if SQL.search(text):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: SQL text {text.strip()[:60]!r}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in EXECUTES and DATABASE_HANDLE.search(_name(node.func.value))):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {_name(node.func.value)}.{node.func.attr}(...)")
    return found


def _sources() -> list[Path]:
    files = [*(ROOT / "worker").rglob("*.py"), *(ROOT / "operator").rglob("*.py")]
    return sorted(p for p in files if STORE not in p.parents and p not in TOOLS_OWN_TABLES)


def test_no_sql_outside_the_store() -> None:
    found = [line for path in _sources() for line in statements_outside_the_store(path)]
    assert not found, "SQL outside worker/store/ (move it into the store):\n" + "\n".join(found)


def test_the_check_sees_the_statements_it_looks_for() -> None:
    """The detector finds what the store holds and what the tool keeps: it is not blind."""
    assert statements_outside_the_store(STORE / "claims.py")
    assert statements_outside_the_store(STORE / "channels.py")
    assert statements_outside_the_store(next(iter(TOOLS_OWN_TABLES)))
