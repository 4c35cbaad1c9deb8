"""Issue 28, done when: real `agentrun worker` processes, real PostgreSQL and the local model servers (the
real SDKs, the compaction and context-editing betas, a 16,000-token window enforced with the real APIs'
400). A run of 200 turns whose tool results are 2 KB completes with each strategy and no request sent over
the window; a kill -9 during the summarising call resumes with exactly one COMPACT step for it; the
compaction blocks go back byte-identical; `none` fails before sending, with the reason."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrun.worker.core.records import RunStatus, StepKind
from agentrun.worker.store import RunStore
from agentrun.worker.testing.fake_openai_server import FakeOpenAi, LongChatResponder
from agentrun.worker.testing.fake_server import FakeAnthropic, LongResponder, Reply
from tests.support.builders import new_run
from tests.support.ports import free_port
from tests.support.processes import start_worker, stop, wait_ready
from tests.support.running import finished

REPO = Path(__file__).resolve().parents[2]
WINDOW = 16_000
TURNS = 200
MODEL = "claude-window-16k"
ARGS = ("--concurrency", "4", "--lease-seconds", "3", "--poll-interval", "0.2", "--no-migrate", "--max-tokens", "1024")
PRICE = "input = 3.0\noutput = 15.0\ncache_write = 3.75\ncache_read = 0.3\n"
LIMITS = f"context_window = {WINDOW}\nmax_output_tokens = 1024\n"


@pytest.fixture
def prices(tmp_path: Path) -> Path:
    path = tmp_path / "prices.toml"
    path.write_text(f'[models."{MODEL}"]\n{PRICE}{LIMITS}server_compaction = true\n\n'
                    f'[models."local/{MODEL}"]\n{PRICE}{LIMITS}')
    return path


def _env(database_url: str, prices: Path, anthropic: str, openai: str, tmp: Path) -> dict[str, str]:
    providers = tmp / "providers.yaml"
    providers.write_text(f"providers:\n  - name: local\n    kind: openai\n    baseUrl: {openai}\n"
                         "    apiKeyEnv: LOCAL_API_KEY\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"AGENTRUN_DATABASE_URL": database_url, "ANTHROPIC_BASE_URL": anthropic, "ANTHROPIC_API_KEY": "test",
                "LOCAL_API_KEY": "sk-local", "AGENTRUN_PROVIDERS": str(providers),
                "AGENTRUN_PRICES_FILE": str(prices), "AGENTRUN_TOOLS": "tests.llm.context_tools",
                "PYTHONPATH": str(REPO), "AGENTRUN_LLM_BACKOFF_BASE_SECONDS": "0.01"})
    return env


@pytest.fixture
async def servers() -> AsyncIterator[tuple[FakeAnthropic, FakeOpenAi]]:
    async with FakeAnthropic(LongResponder("fetch_page", TURNS), context_window=WINDOW,
                             compaction_min_trigger=1) as anthropic, \
            FakeOpenAi(LongChatResponder("fetch_page", TURNS), context_window=WINDOW) as openai:
        yield anthropic, openai


async def _submit(store: RunStore, strategy: str, model: str = MODEL, **policy: Any) -> Any:
    run, _ = await store.create(new_run("read every page of the document", model=model, tools=("fetch_page",),
                                        max_steps=4 * TURNS + 50, token_budget=10**9, timeout_seconds=900))
    async with store.pool.connection() as db:
        await db.execute("UPDATE run SET context_management = %s WHERE id = %s",
                         (json.dumps({"strategy": strategy, **policy}), run.id))
    return run


async def _drive(env: dict[str, str], store: RunStore, run: Any, name: str) -> Any:
    port = free_port()
    proc = await start_worker(port, "--id", name, *ARGS, env=env)
    try:
        await wait_ready(f"http://127.0.0.1:{port}", proc)
        return await finished(store, run.id, 300)
    finally:
        await stop(proc)


@pytest.mark.parametrize(("provider", "strategy"), [
    ("anthropic", "server"), ("anthropic", "summarize"), ("anthropic", "clear_tool_results"),
    ("openai", "summarize"), ("openai", "clear_tool_results"),
])
async def test_a_200_turn_run_completes_under_a_16k_window_with_each_strategy(
    store: RunStore, database_url: str, prices: Path, servers: tuple[FakeAnthropic, FakeOpenAi], tmp_path: Path,
    provider: str, strategy: str,
) -> None:
    anthropic, openai = servers
    env = _env(database_url, prices, anthropic.base_url, openai.v1_url, tmp_path)
    # `server` keeps the newest 50 tool uses from the API's clearing, so that its compaction is needed too.
    keep = {"keepRecentTurns": 50} if strategy == "server" else {}
    run = await _submit(store, strategy, MODEL if provider == "anthropic" else f"local/{MODEL}", **keep)
    done = await _drive(env, store, run, f"context-{provider}-{strategy}")
    assert done.status is RunStatus.SUCCEEDED, done.error
    assert done.output == f"done after {TURNS} tool turns"
    steps = await store.steps(run.id)
    assert sum(1 for s in steps if s.kind is StepKind.TOOL) == TURNS  # every original step kept
    if strategy == "server":
        assert any(s.kind is StepKind.MODEL and '"type":"compaction"' in (s.response or "") for s in steps)
    else:
        assert any(s.kind is StepKind.COMPACT for s in steps)
    # No request was sent over the window: the server refused none with its 400.
    server = anthropic if provider == "anthropic" else openai
    assert server.input_tokens and max(server.input_tokens) + 1024 <= WINDOW


async def test_none_fails_such_a_run_before_sending_with_the_reason(
    store: RunStore, database_url: str, prices: Path, servers: tuple[FakeAnthropic, FakeOpenAi], tmp_path: Path
) -> None:
    anthropic, openai = servers
    env = _env(database_url, prices, anthropic.base_url, openai.v1_url, tmp_path)
    failed = await _drive(env, store, await _submit(store, "none"), "context-none")
    assert failed.status is RunStatus.FAILED
    assert failed.error is not None and f"> {WINDOW} tokens" in failed.error and "it was not sent" in failed.error
    assert max(anthropic.input_tokens) + 1024 <= WINDOW


async def test_replay_sends_the_compaction_blocks_back_byte_identical(
    store: RunStore, database_url: str, prices: Path, servers: tuple[FakeAnthropic, FakeOpenAi], tmp_path: Path
) -> None:
    anthropic, openai = servers
    env = _env(database_url, prices, anthropic.base_url, openai.v1_url, tmp_path)
    run = await _submit(store, "server", keepRecentTurns=50)  # the API's clearing alone would be enough
    port = free_port()
    proc = await start_worker(port, "--id", "context-2", *ARGS, env=env)
    try:
        await wait_ready(f"http://127.0.0.1:{port}", proc)
        done = await finished(store, run.id, 300)
    finally:
        await stop(proc)
    assert done.status is RunStatus.SUCCEEDED, done.error
    stored = [b for s in await store.steps(run.id) if s.kind is StepKind.MODEL
              for b in json.loads(s.response or "[]") if b.get("type") == "compaction"]
    assert stored
    sent = [b for body in anthropic.requests for m in body.get("messages", []) if m["role"] == "assistant"
            and isinstance(m["content"], list) for b in m["content"] if b.get("type") == "compaction"]
    for block in stored:  # each one the API returned went back in every later request, exactly as returned
        copies = [b for b in sent if b.get("content") == block.get("content")]
        assert copies and all(json.dumps({k: v for k, v in b.items() if k != "cache_control"}, sort_keys=True)
                              == json.dumps(block, sort_keys=True) for b in copies)
    received = [r for r in anthropic.received if r.body is not None and r.body.get("context_management")]
    assert received and all("compact-2026-01-12" in r.headers.get("anthropic-beta", "") for r in received)


async def test_a_kill_9_during_the_summarising_call_resumes_with_exactly_one_compact_step(
    store: RunStore, database_url: str, prices: Path, tmp_path: Path
) -> None:
    long = LongResponder("fetch_page", 40)
    asked = asyncio.Event()
    held = {"first": True}

    def responder(body: dict[str, Any]) -> Reply:
        reply = long(body)
        if not body.get("tools") and held["first"]:  # the summarising call: the first one hangs
            held["first"] = False
            asked.set()
            return reply.after(60)
        return reply

    async with FakeAnthropic(responder, context_window=WINDOW) as anthropic, FakeOpenAi(LongChatResponder("fetch_page", 40)) as openai:
        env = _env(database_url, prices, anthropic.base_url, openai.v1_url, tmp_path)
        run = await _submit(store, "summarize")
        port = free_port()
        first = await start_worker(port, "--id", "context-3", *ARGS, env=env)
        try:
            await wait_ready(f"http://127.0.0.1:{port}", first)
            await asyncio.wait_for(asked.wait(), 120)
            first.kill()  # SIGKILL while the summary is being written
            await first.wait()
        finally:
            if first.returncode is None:
                first.kill()
                await first.wait()
        assert not [s for s in await store.steps(run.id) if s.kind is StepKind.COMPACT]
        port = free_port()
        second = await start_worker(port, "--id", "context-4", *ARGS, env=env)
        try:
            await wait_ready(f"http://127.0.0.1:{port}", second)
            done = await finished(store, run.id, 300)
        finally:
            await stop(second)
        summaries = [b for b in anthropic.requests if not b.get("tools")]
    assert done.status is RunStatus.SUCCEEDED, done.error
    steps = await store.steps(run.id)
    compact = [s for s in steps if s.kind is StepKind.COMPACT]
    # The killed call was made again once; every other summary once: one COMPACT step per answered call.
    assert len(compact) == len(summaries) - 1 >= 1
    covers = [json.loads(s.request or "{}")["keepFromSeq"] for s in compact]
    assert len(covers) == len(set(covers))  # no point summarised twice
