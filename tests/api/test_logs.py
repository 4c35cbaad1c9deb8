"""Log lines: the console format of the design, ECS JSON carrying run_id and step_seq, secrets redacted."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from agentrun.worker.obs import logs
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolBox
from tests.support.builders import new_run, worker


@pytest.fixture
def capture() -> Iterator[tuple[io.StringIO, logging.Handler]]:
    """A handler like the one `logs.setup` installs, writing to a buffer."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(logs.ContextFilter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield out, handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


async def drive_one(store: RunStore, toolbox: ToolBox) -> str:
    created, _ = await store.create(new_run())
    llm = ScriptedLlm().then_tool_use("toolu_01Ab", "lookup", {"q": "acme"}, in_=812, out=64).then_text("done", 1210, 140)
    await worker(store, llm, toolbox).run_once()
    return str(created.id)


async def test_json_lines_carry_run_id_and_step_seq(
    capture: tuple[io.StringIO, logging.Handler], store: RunStore, toolbox: ToolBox
) -> None:
    out, handler = capture
    handler.setFormatter(logs.formatter("json", logs.Redactor()))
    run_id = await drive_one(store, toolbox)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines and all(line["log.level"] and line["@timestamp"] and "message" in line for line in lines)
    steps = [(line["step_seq"], line["message"]) for line in lines if line.get("step_seq") is not None]
    assert [seq for seq, _ in steps] == [1, 2, 2, 3]
    assert "seq=1 MODEL stop=tool_use in=812 out=64" in steps[0][1]
    assert "seq=2 TOOL lookup id=toolu_01Ab started" in steps[1][1]
    assert all(line["run_id"] == run_id for line in lines if line.get("step_seq") is not None)
    # The end of the run: its run_id, no step.
    assert any("SUCCEEDED" in line["message"] and line.get("run_id") == run_id and line.get("step_seq") is None
               for line in lines)
    # Outside a run the context is empty again.
    logging.getLogger("agentrun.test").info("after the run")
    last = json.loads(out.getvalue().splitlines()[-1])
    assert last.get("run_id") is None and last.get("step_seq") is None


async def test_console_lines_are_the_designs(
    capture: tuple[io.StringIO, logging.Handler], store: RunStore, toolbox: ToolBox
) -> None:
    out, handler = capture
    handler.setFormatter(logs.formatter("console", logs.Redactor()))
    run_id = await drive_one(store, toolbox)
    text = out.getvalue()
    short = run_id.replace("-", "")[:8]
    assert f"worker-A run={short} seq=1 MODEL stop=tool_use in=812 out=64 latency=" in text
    assert f"worker-A run={short} seq=2 TOOL lookup id=toolu_01Ab started" in text
    assert f"worker-A run={short} SUCCEEDED tokens=2226" in text


def test_step_context_nests_and_resets() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    with logs.step_context(run_id="r1"):
        with logs.step_context(step_seq=3):
            logs.set_context(step_seq=4)
            logs.ContextFilter().filter(record)
            assert (record.run_id, record.step_seq) == ("r1", 4)  # type: ignore[attr-defined]
        inner = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
        logs.ContextFilter().filter(inner)
        assert (inner.run_id, inner.step_seq) == ("r1", None)  # type: ignore[attr-defined]


SECRET_KEY = "sk-ant-api03-AbCdEf0123456789_xyz"
TOKEN = "tok-9f8e7d6c5b4a"
DB_PASSWORD = "pg-p@ss:word"


@pytest.mark.parametrize("fmt", ["console", "json"])
def test_secrets_never_reach_a_line(capture: tuple[io.StringIO, logging.Handler], fmt: str) -> None:
    out, handler = capture
    env = {
        "ANTHROPIC_API_KEY": SECRET_KEY,
        "AGENTRUN_API_TOKEN": TOKEN,
        "AGENTRUN_DATABASE_URL": "postgresql://agentrun:pg-p%40ss%3Aword@db:5432/agentrun",
    }
    secrets = logs.secrets_from_env(env)
    assert set(secrets) == {SECRET_KEY, TOKEN, DB_PASSWORD}
    handler.setFormatter(logs.formatter(fmt, logs.Redactor(secrets)))
    log = logging.getLogger("agentrun.test")
    log.info("calling the model with key %s", SECRET_KEY)
    log.info("header Authorization: Bearer %s", TOKEN)
    log.warning("cannot connect to postgresql://agentrun:hunter22@db:5432/agentrun")
    log.warning("cannot connect: host=db user=agentrun password=hunter22 dbname=x")
    log.info("an unknown key sk-ant-api03-ZZZZZZZZZZZZ leaked")
    log.info("the raw password %s", DB_PASSWORD)
    try:
        raise RuntimeError(f"failed with token {TOKEN}")
    except RuntimeError:
        log.exception("unexpected")
    text = out.getvalue()
    for secret in (SECRET_KEY, TOKEN, DB_PASSWORD, "hunter22", "ZZZZZZZZZZZZ"):
        assert secret not in text, secret
    assert text.count(logs.REDACTED) >= 7
    assert "postgresql://agentrun:[REDACTED]@db:5432/agentrun" in text
    if fmt == "json":
        for line in text.splitlines():
            json.loads(line)  # still JSON after redaction


def test_redactor_leaves_ordinary_text_alone() -> None:
    redact = logs.Redactor(["", "ab", None, "long-enough-secret"])
    text = "worker-A run=6f1c0a52 seq=1 MODEL stop=tool_use in=812 out=64 latency=1830ms"
    assert redact(text) == text
    assert redact("see http://example.com/path and a@b.c") == "see http://example.com/path and a@b.c"


FILE_TOKEN = "agrt_Zk3vQ9xY-w_7bN2mL5pR8sT1uV4oJ6hG0cE2aD9fK3i"  # the shape `agentrun token new` makes


@pytest.mark.parametrize("fmt", ["console", "json"])
def test_tokens_of_the_tokens_file_never_reach_a_line(capture: tuple[io.StringIO, logging.Handler], fmt: str) -> None:
    # The server knows these tokens only by their SHA-256, so they are redacted by their shape.
    out, handler = capture
    handler.setFormatter(logs.formatter(fmt, logs.Redactor(logs.secrets_from_env({}))))
    log = logging.getLogger("agentrun.test")
    log.info("a client sent %s without the Bearer scheme", FILE_TOKEN)
    log.warning("token=%s;", FILE_TOKEN)
    try:
        raise PermissionError(f"refused {FILE_TOKEN}")
    except PermissionError:
        log.exception("unexpected")
    text = out.getvalue()
    assert FILE_TOKEN not in text and FILE_TOKEN[5:] not in text
    assert text.count(logs.REDACTED) >= 3
    assert "token=[REDACTED];" in text
