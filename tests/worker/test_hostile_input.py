"""Hostile text on the engine side: NUL bytes, lone surrogates, odd Unicode and very long strings in the
run's input, in tool output and in model answers never crash a worker and are stored safely."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.worker.llm.scripted import ScriptedLlm
from agentrun.worker.llm.types import LlmError
from agentrun.worker.records import RunStatus, StepStatus
from agentrun.worker.replay import Conversation
from agentrun.worker.store import RunStore
from agentrun.worker.tools import ToolContext, tool
from tests.helpers import new_run, worker

ODD = "\u202eevil\u202c \u200d\U0001f469\u200d\U0001f4bb e\u0301\u0301\u0301 \uffff \ufeff 𝔘𝔫𝔦 \x01\x1b[31m"


@pytest.mark.parametrize(
    ("text", "why"),
    [("a\x00b", "NUL character"), ("a\ud800b", "lone surrogate")],
)
async def test_input_that_cannot_be_stored_is_refused_with_a_reason(store: RunStore, text: str, why: str) -> None:
    with pytest.raises(ValueError, match=f"run input contains a {why}"):
        await store.create(new_run(text))
    with pytest.raises(ValueError, match=f"run system contains a {why}"):
        await store.create(new_run("fine", system=text))
    assert await store.list_runs() == []


async def test_odd_unicode_and_long_input_round_trip(store: RunStore) -> None:
    text = ODD + "x" * 1_000_000
    run, _ = await store.create(new_run(text))
    llm = ScriptedLlm().then_text(ODD)
    assert await worker(store, llm, []).run_once() == run.id
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.SUCCEEDED and after.input == text
    assert llm.seen[0].messages[0]["content"] == text


async def test_nul_and_surrogates_in_tool_output_are_replaced_and_noted(store: RunStore) -> None:
    @tool(name="binary")
    async def binary(args: dict[str, Any], ctx: ToolContext) -> str:
        return "head\x00tail\ud800!"

    @tool(name="raises")
    async def raises(args: dict[str, Any], ctx: ToolContext) -> str:
        raise RuntimeError("bad\x00byte")

    llm = ScriptedLlm().then_tool_uses([("t1", "binary", {}), ("t2", "raises", {})]).then_text("ok")
    run, _ = await store.create(new_run())
    assert await worker(store, llm, [binary, raises]).run_once() == run.id
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.SUCCEEDED
    steps = {s.tool_use_id: s for s in await store.steps(run.id)}
    assert steps["t1"].response == "head\ufffdtail\ufffd!\n[2 NUL or invalid characters replaced with U+FFFD]"
    assert steps["t2"].status is StepStatus.ERROR
    assert steps["t2"].response == "error: RuntimeError: bad\ufffdbyte\n[1 NUL or invalid characters replaced with U+FFFD]"
    # What the model saw is what was stored, so a resumed run sees the same conversation.
    assert llm.seen[1].messages[-1]["content"][0]["content"] == steps["t1"].response


async def test_nul_in_model_answers_is_stored_and_replays_the_same(store: RunStore) -> None:
    @tool(name="lookup")
    async def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
        return f"looked up {args['q']}"

    llm = (
        ScriptedLlm()
        .then_tool_use("toolu_\x00a", "look\x00up", {"q": "\x00"})  # a tool that does not exist, named with NUL
        .then_tool_use("toolu_b", "lookup", {"q": "x\x00y"})
        .then_text("done\x00 with \ud83d\ude00 and \udc00")
    )
    run, _ = await store.create(new_run())
    assert await worker(store, llm, [lookup]).run_once() == run.id
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.SUCCEEDED, after.error
    steps = await store.steps(run.id)
    assert [(s.kind.value, s.status.value, s.tool_use_id) for s in steps] == [
        ("MODEL", "DONE", None), ("TOOL", "ERROR", "toolu_\ufffda"), ("MODEL", "DONE", None),
        ("TOOL", "DONE", "toolu_b"), ("MODEL", "DONE", None),
    ]
    assert steps[1].tool_name == "look\ufffdup" and steps[3].response == "looked up x\ufffdy"
    conv = Conversation.replay(run.input, steps)
    assert conv.finished and conv.messages[-1]["content"] == [{"type": "text", "text": "done\ufffd with 😀 and \ufffd"}]
    # The live conversation and the replayed one agree: the last request's history is the replayed one.
    assert llm.seen[-1].messages == conv.messages[:-1]


async def test_model_error_with_nul_ends_the_run_failed_with_a_readable_reason(store: RunStore) -> None:
    llm = ScriptedLlm().then_fail(LlmError(400, None, "invalid\x00request"))
    run, _ = await store.create(new_run())
    assert await worker(store, llm, []).run_once() == run.id
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.FAILED
    assert after.error == "model error 400: invalid\ufffdrequest"
