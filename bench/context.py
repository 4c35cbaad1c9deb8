"""B13 (issue 28): tokens paid for one long run with each context-management strategy.

One run of `--turns` tool turns whose results are `--result-bytes` each, against the local Messages API
server (the real Anthropic SDK, its compaction and context-editing betas, its window enforced with the
real API's 400) and, for `summarize` and `clear_tool_results`, the local Chat Completions server too: with
a `--window`-token window, each strategy; and, for reference, `none` with no window at all. Reported per
strategy: the run's status, the tokens and cost it paid, its COMPACT steps and the largest request the
server counted, against that reference.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrun.worker.core.pricing import PriceTable  # noqa: E402
from agentrun.worker.core.records import StepKind  # noqa: E402
from agentrun.worker.llm.anthropic_client import AnthropicClient  # noqa: E402
from agentrun.worker.llm.openai_client import OpenAiClient  # noqa: E402
from agentrun.worker.runtime.runner import Worker  # noqa: E402
from agentrun.worker.settings import WorkerSettings  # noqa: E402
from agentrun.worker.store import RunStore  # noqa: E402
from agentrun.worker.store.pool import open_pool  # noqa: E402
from agentrun.worker.testing.fake_openai_server import FakeOpenAi, LongChatResponder  # noqa: E402
from agentrun.worker.testing.fake_server import FakeAnthropic, LongResponder  # noqa: E402
from agentrun.worker.tools import ToolBox, ToolContext, tool  # noqa: E402
from bench import _pg  # noqa: E402

MODEL = "claude-window"
UNLIMITED = "claude-unlimited"
PRICE = 'input = 3.0\noutput = 15.0\ncache_write = 3.75\ncache_read = 0.3\n'


def prices(window: int, max_output: int) -> PriceTable:
    return PriceTable.from_toml(
        f'[models."{MODEL}"]\n{PRICE}context_window = {window}\nmax_output_tokens = {max_output}\n'
        f'server_compaction = true\n\n[models."{UNLIMITED}"]\n{PRICE}'
        f'[models."local/{MODEL}"]\n{PRICE}context_window = {window}\nmax_output_tokens = {max_output}\n'
    )


def fetch_tool(result_bytes: int) -> Any:
    page = ("lorem ipsum dolor sit amet " * (result_bytes // 27 + 1))[:result_bytes]

    @tool(name="fetch_page", description="fetches a page", idempotent=True)
    async def fetch_page(args: dict[str, Any], ctx: ToolContext) -> str:
        return page

    return fetch_page


async def one(url: str, *, provider: str, strategy: str, turns: int, result_bytes: int, window: int | None,
              max_output: int) -> dict[str, Any]:
    pool = await open_pool(url, max_size=4)
    responder = LongResponder("fetch_page", turns)
    server: FakeAnthropic | FakeOpenAi
    if provider == "anthropic":
        server = FakeAnthropic(responder, context_window=window, compaction_min_trigger=1, record=False)
    else:
        server = FakeOpenAi(LongChatResponder("fetch_page", turns), context_window=window)
    try:
        async with server:
            if provider == "anthropic":
                llm: Any = AnthropicClient(api_key="bench", base_url=server.base_url)
                model = MODEL if window is not None else UNLIMITED
            else:
                from agentrun.worker.llm.router import ProviderRouter

                llm = ProviderRouter({"local": lambda: OpenAiClient(api_key="bench", base_url=server.v1_url)})
                model = f"local/{MODEL}"
            store = RunStore(pool)
            run, _ = await store.create(_pg.new_run(
                "read every page", model=model, tools=("fetch_page",), max_steps=4 * turns + 50,
                token_budget=10**9, timeout_seconds=3600,
            ))
            async with pool.connection() as db:
                await db.execute("UPDATE run SET context_management = %s WHERE id = %s",
                                 (f'{{"strategy": "{strategy}"}}', run.id))
            settings = WorkerSettings(database_url="unused", worker_id="bench-context", max_tokens=max_output)
            worker = Worker(settings, store, llm, ToolBox([fetch_tool(result_bytes)]), prices(window or 10**6,
                                                                                              max_output))
            await worker.run_once()
            done = await store.get(run.id)
            steps = await store.steps(run.id)
            await llm.aclose()
    finally:
        await pool.close()
    assert done is not None
    counted = getattr(server, "input_tokens", [])
    return {
        "provider": provider, "strategy": strategy, "window": window, "status": done.status.value,
        "error": done.error, "tokens": done.tokens_used, "cost_usd": float(done.cost_usd),
        "compact_steps": sum(1 for s in steps if s.kind is StepKind.COMPACT),
        "model_steps": sum(1 for s in steps if s.kind is StepKind.MODEL),
        "largest_request": max(counted, default=None),
    }


async def bench(url: str, turns: int, result_bytes: int, window: int, max_output: int) -> dict[str, Any]:
    cases = [("anthropic", "none", None), ("anthropic", "server", window), ("anthropic", "summarize", window),
             ("anthropic", "clear_tool_results", window), ("openai", "summarize", window),
             ("openai", "clear_tool_results", window), ("anthropic", "none", window)]
    results = []
    for provider, strategy, w in cases:
        results.append(await one(url, provider=provider, strategy=strategy, turns=turns, result_bytes=result_bytes,
                                 window=w, max_output=max_output))
    reference = results[0]["tokens"] or 1
    for r in results:
        r["tokens_vs_unlimited"] = round(r["tokens"] / reference, 3)
    return {"turns": turns, "result_bytes": result_bytes, "window": window, "runs": results}


def main() -> None:
    p = _pg.parser(__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=200)
    p.add_argument("--result-bytes", type=int, default=2048)
    p.add_argument("--window", type=int, default=16_000)
    p.add_argument("--max-output", type=int, default=1024)
    args = p.parse_args()
    with _pg.database(args.database_url) as url:
        env = _pg.describe(url)
        figures = asyncio.run(bench(url, args.turns, args.result_bytes, args.window, args.max_output))
    print(f"B13 context: one run of {args.turns} tool turns, {args.result_bytes}-byte results, "
          f"{args.window}-token window")
    for r in figures["runs"]:
        window = "unlimited" if r["window"] is None else r["window"]
        print(f"  {r['provider']:9} {r['strategy']:18} window {window:>9}: {r['status']:9} tokens {r['tokens']:>9} "
              f"({r['tokens_vs_unlimited']:.3f} × none unlimited), ${r['cost_usd']:.4f}, "
              f"{r['compact_steps']} COMPACT steps, largest request {r['largest_request']}")
    _pg.emit({**figures, **env})


if __name__ == "__main__":
    main()
