"""Hostile input through `agentrun runs …` against a real server: a clear message and exit status 1 (or
argparse's 2), never a traceback; ids cannot steer a request to another path; text from runs cannot
rewrite the terminal."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse

from agentrun.worker import cli
from agentrun.worker.cli.client import terminal_safe
from tests.support.cli import agentrun
from tests.support.serving import serving

pytestmark = pytest.mark.usefixtures("restore_logging")
REPO = Path(__file__).resolve().parents[2]

# (argv after `runs`, what stderr must say); every one exits 1 without touching the server's data.
REFUSED: list[tuple[list[str], str]] = [
    (["submit", "bad \udcff bytes"], "input: contains a lone surrogate"),
    (["submit", "nul \x00 here"], "input: contains a NUL character"),
    (["submit", "x", "--system", "\udcff"], "system: contains a lone surrogate"),
    (["submit", "x", "--tool", "noop", "--tool", "no\x00op"], "tools[1]: contains a NUL character"),
    (["submit", "x", "--model", "m" * 100_000], "model: must have at most 200 characters (HTTP 422)"),
    (["submit", "x", "--tool", "\u202erm_rf"], "unknown tool '\\u202erm_rf'"),
    (["submit", "x", "--cost-budget", "1e-300"], "costBudgetUsd: must be greater than or equal to 0.000001"),
    (["submit", "x", "--budget", "9" * 40], "tokenBudget: must be less than or equal to"),
    (["submit", "x", "--idempotency-key", "ké"], "the idempotency key 'ké' must be printable ASCII"),
    (["submit", "x", "--idempotency-key", "a\nb"], "the idempotency key 'a\\nb' must be printable ASCII"),
    (["get", "../../metrics"], "run id '../../metrics' is not a valid UUID"),
    (["get", "?status=QUEUED"], "run id '?status=QUEUED' is not a valid UUID"),
    (["get", "\x00"], "run id '\\x00' is not a valid UUID"),
    (["timeline", "../../../openapi.json"], "is not a valid UUID"),
    (["cancel", "\udcff"], "run id '\\udcff' is not a valid UUID"),
    (["watch", "../../healthz"], "is not a valid UUID"),
    (["list", "--after", "x" * 100_000], "cursor --after 'xxxxx"),
]


@pytest.mark.parametrize(("argv", "says"), REFUSED, ids=[repr(a)[:50] for a, _ in REFUSED])
async def test_hostile_arguments_get_a_message_not_a_traceback(
    server_url: str, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    code, out, err = await agentrun(capsys, "runs", *argv, "--url", server_url)
    assert code == 1, (out, err)
    assert says in err and err.startswith("agentrun: ") and "Traceback" not in err
    assert len(err) < 400  # a 100 000-character argument is not echoed whole
    code, out, _ = await agentrun(capsys, "runs", "list", "--url", server_url, "--json")
    assert out.startswith('{"items":[]')  # nothing was queued


@pytest.mark.parametrize("flag", [["--cost-budget", "inf"], ["--cost-budget", "nan"], ["--budget", "-1"],
                                  ["--timeout", "1e3"]])
def test_bad_numbers_are_refused_by_the_parser(flag: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        cli.main(["runs", "submit", "x", *flag, "--url", "http://127.0.0.1:9"])
    assert exit.value.code == 2
    assert f"argument {flag[0]}" in capsys.readouterr().err


async def test_odd_unicode_and_long_input_are_queued_as_written(
    server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = "naïve e\u0301 🤖 \U0001f9d1\u200d\U0001f4bb עברית \u202eevil " * 3000  # ~120 000 characters
    code, out, _ = await agentrun(capsys, "runs", "submit", text, "--url", server_url, "--json")
    assert code == 0
    run_id = out.split('"id":"')[1].split('"')[0]
    code, out, _ = await agentrun(capsys, "runs", "get", run_id, "--url", server_url, "--json")
    assert code == 0 and '"input":"naïve e\u0301 🤖' in out and "\u202e" in out  # JSON output is the data


async def test_text_from_a_run_cannot_rewrite_the_terminal(server_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    hostile = "ok\x1b[2J\x1b]0;pwned\x07 \u202egnp.exe \x85 e\u0301 \U0001f9d1\u200d\U0001f4bb"
    code, out, _ = await agentrun(capsys, "runs", "submit", hostile, "--url", server_url)
    run_id = out.split()[0]
    for command in ("get", "list"):
        code, out, _ = await agentrun(capsys, "runs", command, *([run_id] if command == "get" else []),
                                      "--url", server_url)
        assert code == 0
        assert not any(c in out for c in "\x1b\x07\x85\u202e"), repr(out)
        assert "\\x1b[2J" in out and "\\u202egnp.exe" in out
    assert "e\u0301 \U0001f9d1\u200d\U0001f4bb" in terminal_safe(hostile)  # marks, emoji and joiners stay


def _other_server(answer: Any) -> FastAPI:
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def anything(path: str) -> Any:
        return answer

    return app


@pytest.mark.parametrize(("answer", "says"), [
    (PlainTextResponse("<html>hello</html>"), "with something other than JSON; is it an agentrun worker?"),
    (JSONResponse({"unrelated": True}), "answered without the expected fields"),
    (JSONResponse([1, 2]), "answered without the expected fields"),
])
async def test_a_url_that_is_not_an_agentrun_worker(capsys: pytest.CaptureFixture[str], answer: Any, says: str) -> None:
    async with serving(_other_server(answer)) as url:
        for argv in (["get", "6f1c0a52-0000-4000-8000-000000000000"], ["list"], ["submit", "x"]):
            code, _, err = await agentrun(capsys, "runs", *argv, "--url", url)
            assert code == 1 and says in err and "Traceback" not in err, (argv, err)


@pytest.mark.parametrize(("url", "says"), [("http://[::1", "not a usable server URL"),
                                           ("ftp://example", "cannot reach"), ("localhost:8080", "cannot reach")])
async def test_a_malformed_url(capsys: pytest.CaptureFixture[str], url: str, says: str) -> None:
    code, _, err = await agentrun(capsys, "runs", "list", "--url", url)
    assert code == 1 and says in err and "Traceback" not in err


async def test_a_token_that_is_not_printable_ascii_is_refused_without_echoing_it(
    server_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for token in ("s3cret-é-token", "s3cret\ntoken"):
        monkeypatch.setenv("AGENTRUN_API_TOKEN", token)
        code, _, err = await agentrun(capsys, "runs", "list", "--url", server_url)
        assert code == 1 and "AGENTRUN_API_TOKEN" in err and "s3cret" not in err


async def test_bytes_that_are_not_utf8_in_a_real_process(server_url: str) -> None:
    """What a shell really passes: argv bytes, here not UTF-8, decoded by Python with surrogateescape."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "AGENTRUN_URL": server_url}
    for argv in ([b"submit", b"caf\xe9 \xff"], [b"get", b"\xff\xfe"], [b"submit", b"x", b"--idempotency-key", b"\xff"]):
        proc = await asyncio.to_thread(
            subprocess.run, [sys.executable.encode(), b"-m", b"agentrun.worker.cli", b"runs", *argv],
            env=env, cwd=REPO, capture_output=True, timeout=60,
        )
        err = proc.stderr.decode(errors="replace")
        assert proc.returncode == 1 and err.startswith("agentrun: ") and "Traceback" not in err, (argv, err)
