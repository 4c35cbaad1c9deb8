"""`<NAME>_FILE` for every secret variable (worker/settings.py): the chart mounts secrets as files by default."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentrun.worker.settings import load_secret_files, secret_from_env


def test_the_variable_itself_when_no_file_is_named() -> None:
    assert secret_from_env({"AGENTRUN_API_TOKEN": "tok"}, "AGENTRUN_API_TOKEN") == "tok"
    assert secret_from_env({}, "AGENTRUN_API_TOKEN") is None


def test_the_file_without_its_trailing_newline(tmp_path: Path) -> None:
    f = tmp_path / "url"
    f.write_text("postgresql://u:p@db/agentrun\n")
    assert secret_from_env({"AGENTRUN_DATABASE_URL_FILE": str(f)}, "AGENTRUN_DATABASE_URL") == \
        "postgresql://u:p@db/agentrun"
    f.write_text("key\r\n")
    assert secret_from_env({"ANTHROPIC_API_KEY_FILE": str(f)}, "ANTHROPIC_API_KEY") == "key"
    f.write_text("  key with spaces \n\n")  # only one newline is the file's ending; the rest is the value
    assert secret_from_env({"ANTHROPIC_API_KEY_FILE": str(f)}, "ANTHROPIC_API_KEY") == "  key with spaces \n"


def test_both_set_is_an_error_naming_both(tmp_path: Path) -> None:
    f = tmp_path / "tok"
    f.write_text("from-file")
    with pytest.raises(ValueError, match="AGENTRUN_API_TOKEN and AGENTRUN_API_TOKEN_FILE are both set"):
        secret_from_env({"AGENTRUN_API_TOKEN": "x", "AGENTRUN_API_TOKEN_FILE": str(f)}, "AGENTRUN_API_TOKEN")


def test_an_unreadable_file_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ValueError, match=f"AGENTRUN_DATABASE_URL_FILE: cannot read {missing}"):
        secret_from_env({"AGENTRUN_DATABASE_URL_FILE": str(missing)}, "AGENTRUN_DATABASE_URL")
    with pytest.raises(ValueError, match=f"AGENTRUN_DATABASE_URL_FILE: cannot read {tmp_path}"):
        secret_from_env({"AGENTRUN_DATABASE_URL_FILE": str(tmp_path)}, "AGENTRUN_DATABASE_URL")  # a directory


def test_load_sets_the_known_and_the_named_variables(tmp_path: Path) -> None:
    (tmp_path / "aws").write_text("secret\n")
    (tmp_path / "mcp").write_text("bearer\n")
    env = {"AWS_SECRET_ACCESS_KEY_FILE": str(tmp_path / "aws"), "MCP_TOKEN_FILE": str(tmp_path / "mcp"),
           "UNRELATED_FILE": str(tmp_path / "missing"), "ANTHROPIC_API_KEY": "direct"}
    load_secret_files(env, ["MCP_TOKEN"])
    assert env["AWS_SECRET_ACCESS_KEY"] == "secret"
    assert env["MCP_TOKEN"] == "bearer"
    assert env["ANTHROPIC_API_KEY"] == "direct"
    assert "UNRELATED" not in env  # only secret variables are read from files


def test_the_cli_reads_the_database_url_from_its_file(tmp_path: Path) -> None:
    """End to end through `agentrun`: a bad file stops the command with the error, before any connection."""
    env = {"PATH": "/usr/bin:/bin", "AGENTRUN_DATABASE_URL_FILE": str(tmp_path / "absent")}
    out = subprocess.run([sys.executable, "-m", "agentrun.worker.cli.main", "migrate"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert f"agentrun: AGENTRUN_DATABASE_URL_FILE: cannot read {tmp_path / 'absent'}" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_cli_connects_with_the_url_from_its_file(tmp_path: Path, database_url: str) -> None:
    """`agentrun migrate` against the real database, its URL only in a file (with the newline `echo` leaves)."""
    url_file = tmp_path / "url"
    url_file.write_text(database_url + "\n")
    env = {"PATH": "/usr/bin:/bin", "AGENTRUN_DATABASE_URL_FILE": str(url_file)}
    out = subprocess.run([sys.executable, "-m", "agentrun.worker.cli.main", "migrate"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
