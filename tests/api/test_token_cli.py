"""`agentrun token new` makes a token and its line for the tokens file; the CLI client uses it, and a
worker refuses to start on a broken tokens file with a message naming the problem."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from agentrun.worker import cli
from agentrun.worker.api.app import create_app
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.tools import ToolBox
from tests.support.builders import MODEL, new_run
from tests.support.serving import serving

pytestmark = pytest.mark.usefixtures("restore_logging")


def test_token_new_prints_the_token_once_and_the_line_to_add(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["token", "new", "alice", "--scopes", "read,decide"]) == 0
    lines = capsys.readouterr().out.splitlines()
    token, line = lines[0], lines[-1]
    assert token.startswith("agrt_") and len(token) >= 40
    assert line.startswith("  - {") and hashlib.sha256(token.encode()).hexdigest() in line
    assert '"name": "alice"' in line and '"scopes": ["read", "decide"]' in line
    assert sum(token in ln for ln in lines) == 1


@pytest.mark.parametrize(("argv", "message"), [
    (["alice", "--scopes", "read,fly"], "--scopes: unknown scope 'fly'; the scopes are: read, submit, decide, "
                                        "cancel, signal, admin"),
    (["alice", "--scopes", " , "], "--scopes: no scopes"),
    (["two words", "--scopes", "read"], "name 'two words': must be"),
])
def test_token_new_refuses_bad_arguments(argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["token", "new", *argv])
    assert message in str(e.value.code)


async def test_the_cli_client_acts_as_the_new_identity(
    tmp_path: Path, store: RunStore, toolbox: ToolBox, metrics: Metrics, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert cli.main(["token", "new", "alice", "--scopes", "read"]) == 0
    lines = capsys.readouterr().out.splitlines()
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("identities:\n" + lines[-1] + "\n")
    run, _ = await store.create(new_run(created_by="ci-bot"))
    settings = WorkerSettings(database_url="unused", default_model=MODEL, api_tokens_file=str(tokens))
    async with serving(create_app(store, toolbox, settings, metrics)) as url:
        monkeypatch.setenv("AGENTRUN_API_TOKEN", lines[0])
        code = await asyncio.to_thread(cli.main, ["runs", "get", str(run.id), "--url", url])
        out, _ = capsys.readouterr()
        assert code == 0 and str(run.id) in out
        assert any(line.split() == ["created", "by", "ci-bot"] for line in out.splitlines())
        code = await asyncio.to_thread(cli.main, ["runs", "cancel", str(run.id), "--url", url])
        _, err = capsys.readouterr()
        assert code == 1 and "identity 'alice' lacks the scope 'cancel'" in err
        assert lines[0] not in err
        monkeypatch.setenv("AGENTRUN_API_TOKEN", lines[0] + "x")
        code = await asyncio.to_thread(cli.main, ["runs", "get", str(run.id), "--url", url])
        _, err = capsys.readouterr()
        assert code == 1 and "missing or wrong bearer token" in err and lines[0] not in err


def test_a_worker_will_not_start_on_a_broken_tokens_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("identities: [{name: a, sha256: agrt_pasted-the-token-itself, scopes: [read]}]")
    monkeypatch.setenv("AGENTRUN_API_TOKENS", str(tokens))
    argv = ["worker", "--concurrency", "0", "--database-url", "postgresql://127.0.0.1:1/nowhere", "--no-migrate"]
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    message = str(e.value.code)
    assert message.startswith("agentrun: ") and "identities[0].sha256: must be the 64 hex digits" in message
    assert "agrt_pasted-the-token-itself" not in message
    monkeypatch.setenv("AGENTRUN_API_TOKENS", str(tmp_path / "absent.yaml"))
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert "cannot read the tokens file" in str(e.value.code) and "AGENTRUN_API_TOKENS" in str(e.value.code)
