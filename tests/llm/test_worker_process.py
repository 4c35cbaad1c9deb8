"""A real `agentrun worker` process serving only an OpenAI-compatible endpoint from its providers file: no
Anthropic key, runs submitted through its REST API, an unknown provider refused there."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

from agentrun.worker.testing.fake_openai_server import ChatAgentResponder, FakeOpenAi
from bench.chaos_tools import EXEC_TABLE
from tests.support.ports import free_port
from tests.support.processes import start_worker, wait_ready

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-local-SECRET-0123456789"


async def test_a_worker_with_only_a_providers_file_runs_a_parallel_tool_run(
    database_url: str, db: psycopg.AsyncConnection[Any], tmp_path: Path
) -> None:
    await db.execute(EXEC_TABLE)  # where chaos_step records its executions
    async with FakeOpenAi(ChatAgentResponder(tool="chaos_step", input={"run": "p", "turn": 0}, parallel=2)) as chat:
        providers = tmp_path / "providers.yaml"
        providers.write_text(f"providers:\n  - {{name: local, kind: openai, baseUrl: '{chat.v1_url}', "
                             "apiKeyEnv: LOCAL_LLM_KEY}\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
        env.update({
            "AGENTRUN_DATABASE_URL": database_url, "AGENTRUN_PROVIDERS": str(providers),
            "AGENTRUN_DEFAULT_MODEL": "local/qwen3-8b", "LOCAL_LLM_KEY": KEY,
            "AGENTRUN_TOOLS": "bench.chaos_tools", "PYTHONPATH": str(REPO),
        })
        port = free_port()
        proc = await start_worker(port, "--id", "provider-worker", "--concurrency", "1", "--poll-interval", "0.1",
                                  env=env)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
                deadline = time.monotonic() + 60
                await wait_ready(f"http://127.0.0.1:{port}", proc, timeout=60, what="the worker's API to come up")
                refused = await http.post("/api/runs", json={
                    "input": "hi", "tokenBudget": 10000, "timeoutSeconds": 60, "model": "gemini/gemini-2.5-pro"})
                created = await http.post("/api/runs", json={
                    "input": "chaos run=p turns=1", "tokenBudget": 100000, "timeoutSeconds": 120})
                assert created.status_code == 201, created.text
                location = created.headers["location"]
                while True:
                    run = (await http.get(location)).json()
                    if run["status"] in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"):
                        break
                    assert time.monotonic() < deadline + 60, f"the run did not finish: {run}"
                    await asyncio.sleep(0.05)
                timeline = (await http.get(f"{location}/timeline")).json()
        finally:
            proc.terminate()
            output, _ = await asyncio.wait_for(proc.communicate(), 30)
    logs = output.decode(errors="replace")

    assert refused.status_code == 422 and "known providers: anthropic, bedrock, vertex, local" in refused.text
    assert run["status"] == "SUCCEEDED", (run, logs[-2000:])
    assert run["model"] == "local/qwen3-8b" and run["tokensUsed"] > 0
    assert [(s["kind"], s["status"]) for s in timeline] == [
        ("MODEL", "DONE"), ("TOOL", "DONE"), ("TOOL", "DONE"), ("MODEL", "DONE")]
    executed = await db.execute("SELECT count(*) FROM chaos_tool_exec")
    assert (await executed.fetchone()) == (2,)
    assert len(chat.requests) == 2 and chat.received[0].headers["Authorization"] == f"Bearer {KEY}"
    assert KEY not in logs
