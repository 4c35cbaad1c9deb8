"""The roles docs/database-role.sql creates, made for one test under names of its own: the file's
sections with those names in, run statement by statement."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

DOC = Path(__file__).resolve().parents[2] / "docs" / "database-role.sql"


def sections(names: dict[str, str]) -> dict[str, str]:
    """The file's sections by their [tag], with the role and database names replaced by this test's."""
    text = DOC.read_text()
    for old, new in names.items():
        text = re.sub(rf"\b{old}\b", new, text)
    parts = re.split(r"^-- \[([a-z ]+)\].*$", text, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


@pytest.fixture
def roles(postgres_url: str) -> Iterator[dict[str, str]]:
    suffix = uuid.uuid4().hex[:8]
    names = {"agentrun_owner": f"ar_owner_{suffix}", "agentrun_runtime": f"ar_runtime_{suffix}",
             "agentrun": f"ar_db_{suffix}"}
    try:
        yield names
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(names["agentrun"])))
            for role in (names["agentrun_runtime"], names["agentrun_owner"]):
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def run_section(url: str, script: str) -> None:
    code = "\n".join(ln.split("--")[0] for ln in script.splitlines())
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in (s.strip() for s in code.split(";")):
            if statement:
                conn.execute(statement.encode())
