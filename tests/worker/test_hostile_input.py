"""Hostile text on the engine side: NUL bytes, lone surrogates, odd Unicode and very long strings in the
run's input, in tool output and in model answers never crash a worker and are stored safely; model
output that cannot be acted on fails the run with a reason, its step still billed."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import psycopg
import pytest

from agentrun.worker.core.observer import UNKNOWN_TOOL
from agentrun.worker.core.records import RunStatus, StepKind, StepStatus
from agentrun.worker.core.replay import Conversation, load_content
from agentrun.worker.core.types import LlmError, LlmResponse, Usage
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolContext, tool
from tests.support.builders import SimulatedCrash, new_run, worker

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
    text = ODD + "x" * 400_000  # long, and still within the model's window (a million would not fit: issue 28)
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


# -- hostile model output: the turn is checkpointed (tokens and cost count), never acted on -----------


def use(id: Any = "t1", name: Any = "lookup", input: Any = None, **extra: Any) -> dict[str, Any]:
    block = {"type": "tool_use", "id": id, "name": name, "input": {"q": "x"} if input is None else input, **extra}
    return {k: v for k, v in block.items() if v is not ...}


def deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


HOSTILE_TURNS: list[tuple[str, list[Any], str | None, str]] = [
    ("an integer beyond 64 bits", [use(input={"n": 2**70})], "tool_use", "holds an integer beyond 64 bits"),
    ("a negative integer beyond 64 bits", [use(input={"n": [-(2**63) - 1]})], "tool_use", "integer beyond 64 bits"),
    ("nesting 200 levels deep", [use(input={"a": deep(200)})], "tool_use", "is nested deeper than 128 levels"),
    ("duplicate ids in one turn", [use("t1"), use("t1")], "tool_use", "used tool_use id 't1' twice in one turn"),
    ("no content blocks", [], "end_turn", "has no content blocks"),
    ("an empty block", [{}], "end_turn", "content block 0 of the model's response is empty"),
    ("a block that is not an object", ["text"], "end_turn", "content block 0 of the model's response is empty"),
    ("a block without a type", [{"text": "hi"}], "end_turn", "content block 0 of the model's response has no type"),
    ("an unknown block", [{"type": "evil", "x": 1}], "end_turn", "has an unknown type 'evil'"),
    ("text that is not a string", [{"type": "text", "text": 5}], "end_turn", "(text) of the model's response has no text"),
    ("an empty text block in a tool turn", [{"type": "text", "text": ""}, use()], "tool_use", "empty text block"),
    ("a missing name", [use(name=...)], "tool_use", "tool_use 't1' of the model's response has no name string"),
    ("a name that is not a string", [use(name=["lookup"])], "tool_use", "has no name string"),
    ("a missing id", [use(id=...)], "tool_use", "tool_use block 0 of the model's response has no id string"),
    ("an id that is not a string", [use(id=7)], "tool_use", "has no id string"),
    ("an input that is not an object", [use(input=["q"])], "tool_use", "has an input that is not a JSON object"),
    ("a tool_use stop without a tool", [{"type": "text", "text": "hm"}], "tool_use", "but asked for none"),
    ("tools with an end_turn stop", [use()], "end_turn", "ended with stop_reason end_turn; they were not run"),
    ("no stop_reason", [{"type": "text", "text": "hi"}], None, "unknown stop_reason None"),
    ("an unknown stop_reason", [{"type": "text", "text": "hi"}], "whatever", "unknown stop_reason 'whatever'"),
]


def lookup_tool(calls: list[Any]) -> Any:
    @tool(name="lookup")
    async def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
        calls.append(args)
        return "found"

    return lookup


@pytest.mark.parametrize(("why", "content", "stop", "reason"), HOSTILE_TURNS, ids=[h[0] for h in HOSTILE_TURNS])
async def test_hostile_model_output_fails_the_run_naming_the_problem_and_counts_its_tokens(
    store: RunStore, why: str, content: list[Any], stop: str | None, reason: str
) -> None:
    calls: list[Any] = []
    run, _ = await store.create(new_run())
    llm = ScriptedLlm().then_response(LlmResponse(content, stop, Usage(1000, 10)))
    assert await worker(store, llm, [lookup_tool(calls)]).run_once() == run.id
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.FAILED
    assert after.error is not None and after.error.startswith("model output refused: ") and reason in after.error
    assert calls == [] and len(llm.seen) == 1  # nothing run, the model not asked again
    assert after.tokens_used == 1010 and after.cost_usd == Decimal("0.003150")  # the step is billed
    steps = await store.steps(run.id)
    assert [(s.kind, s.status) for s in steps] == [(StepKind.MODEL, StepStatus.DONE)]
    # Stored as it came: a worker that resumes the run refuses the same turn for the same reason.
    assert load_content(steps[0].response or "") == content
    conv = Conversation.replay(run.input, steps)
    assert conv.refused is not None and after.error == f"model output refused: {conv.refused}"
    assert not conv.pending


async def test_a_tool_use_id_reused_from_an_earlier_turn_fails_the_run(store: RunStore) -> None:
    calls: list[Any] = []
    llm = ScriptedLlm().then_tool_use("t1", "lookup", {"q": "a"}).then_tool_use("t1", "lookup", {"q": "b"})
    run, _ = await store.create(new_run())
    await worker(store, llm, [lookup_tool(calls)]).run_once()
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.FAILED
    assert after.error == "model output refused: the model reused tool_use id 't1' from an earlier turn"
    assert calls == [{"q": "a"}]


class CrashingFinish(RunStore):
    """A store whose worker dies right after the step that will fail the run, before the run is finished."""

    async def finish(self, *args: Any, **kwargs: Any) -> Any:
        raise SimulatedCrash()


async def test_a_refused_turn_is_refused_again_by_the_worker_that_resumes_it(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    calls: list[Any] = []
    llm = ScriptedLlm().then_response(LlmResponse([use(input={"n": 2**64})], "tool_use", Usage(5, 5)))
    run, _ = await store.create(new_run())
    with pytest.raises(SimulatedCrash):
        await worker(CrashingFinish(store.pool), llm, [lookup_tool(calls)], "worker-A").run_once()
    await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (run.id,))
    await worker(store, llm, [lookup_tool(calls)], "worker-B").run_once()
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.FAILED and after.tokens_used == 10
    assert after.error is not None and "integer beyond 64 bits" in after.error
    assert calls == []  # not as a float, not at all


async def test_tool_names_from_model_output_never_become_metric_labels(store: RunStore) -> None:
    metrics = Metrics()
    llm = (
        ScriptedLlm()
        .then_tool_uses([(f"t{i}", f"made_up_{i}", {}) for i in range(5)] + [("tb", "broken", {})])
        .then_text("ok")
    )

    @tool(name="broken")
    async def broken(args: dict[str, Any], ctx: ToolContext) -> str:
        raise RuntimeError("no")

    run, _ = await store.create(new_run())
    await worker(store, llm, [broken], observer=metrics).run_once()
    labels = {
        s.labels["tool"]: s.value
        for family in metrics.registry.collect() if family.name == "agentrun_tool_errors"
        for s in family.samples if s.name == "agentrun_tool_errors_total"
    }
    assert labels == {UNKNOWN_TOOL: 5, "broken": 1}
