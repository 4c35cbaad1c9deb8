"""Retrying(TimeLimited(AnthropicClient)) against the fake Messages API, with a sleeper that records its waits."""

from __future__ import annotations

import random

import pytest

from agentrun.worker.core.types import MAX_RETRY_AFTER, LlmError, LlmRequest
from agentrun.worker.llm.anthropic_client import AnthropicClient
from agentrun.worker.llm.retry import Retrying, backoff
from agentrun.worker.llm.timeout import TimeLimited
from agentrun.worker.testing.fake_server import FakeAnthropic, Reply
from agentrun.worker.testing.scripted import ScriptedLlm
from tests.support.llm import RecordingSleeper

REQUEST = LlmRequest("claude-sonnet-4-5", 256, [{"role": "user", "content": "hello"}])


def stack(client: AnthropicClient, sleeper: RecordingSleeper, attempts: int = 5, timeout: float = 5.0, **kw: object) -> Retrying:
    return Retrying(TimeLimited(client, timeout), max_attempts=attempts, base=0.5, cap=4.0, sleeper=sleeper, **kw)  # type: ignore[arg-type]


async def test_two_429s_with_retry_after_then_success(
    fake: FakeAnthropic, client: AnthropicClient, sleeper: RecordingSleeper
) -> None:
    fake.script(Reply.rate_limited(7), Reply.rate_limited(7), Reply.text("ok"))

    response = await stack(client, sleeper).send(REQUEST)

    assert response.content == [{"type": "text", "text": "ok"}]
    assert len(fake.requests) == 3
    assert len(sleeper.waits) == 2 and all(w >= 7.0 for w in sleeper.waits)


async def test_a_400_is_not_retried(fake: FakeAnthropic, client: AnthropicClient, sleeper: RecordingSleeper) -> None:
    fake.script(Reply.bad_request("tools.0.name: String should match pattern"))

    with pytest.raises(LlmError) as caught:
        await stack(client, sleeper).send(REQUEST)

    assert len(fake.requests) == 1 and sleeper.waits == []
    assert caught.value.status == 400 and caught.value.message == "tools.0.name: String should match pattern"


@pytest.mark.parametrize("fault", [Reply.overloaded(), Reply.server_error(), Reply.disconnect()], ids=["529", "500", "io"])
async def test_overload_server_errors_and_io_errors_are_retried(
    fake: FakeAnthropic, client: AnthropicClient, sleeper: RecordingSleeper, fault: Reply
) -> None:
    fake.script(fault, fault, Reply.text("ok"))
    statuses: list[int] = []

    response = await stack(client, sleeper, on_retry=statuses.append).send(REQUEST)

    assert response.stop_reason == "end_turn"
    assert len(fake.requests) == 3 and len(sleeper.waits) == 2
    assert statuses == [fault.status if fault.status else -1] * 2


async def test_attempts_are_capped(fake: FakeAnthropic, client: AnthropicClient, sleeper: RecordingSleeper) -> None:
    fake.script(*[Reply.overloaded()] * 10)

    with pytest.raises(LlmError) as caught:
        await stack(client, sleeper, attempts=3).send(REQUEST)

    assert caught.value.status == 529
    assert caught.value.retryable, "an exhausted retryable error must say so, so the run can be handed back"
    assert len(fake.requests) == 3 and len(sleeper.waits) == 2


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422])
async def test_client_errors_fail_at_once(
    fake: FakeAnthropic, client: AnthropicClient, sleeper: RecordingSleeper, status: int
) -> None:
    fake.script(Reply.error(status, "no"), Reply.text("never asked for"))

    with pytest.raises(LlmError) as caught:
        await stack(client, sleeper).send(REQUEST)

    assert caught.value.status == status and not caught.value.retryable
    assert len(fake.requests) == 1 and sleeper.waits == []


@pytest.mark.parametrize("status", [408, 409])
async def test_request_and_lock_timeouts_are_retried(
    fake: FakeAnthropic, client: AnthropicClient, sleeper: RecordingSleeper, status: int
) -> None:
    fake.script(Reply.error(status, "try again"), Reply.text("ok"))

    response = await stack(client, sleeper).send(REQUEST)

    assert response.content == [{"type": "text", "text": "ok"}]
    assert len(fake.requests) == 2 and len(sleeper.waits) == 1


def said(reply: Reply, should_retry: str) -> Reply:
    return Reply(status=reply.status, body=reply.body, headers={**reply.headers, "x-should-retry": should_retry})


async def test_x_should_retry_false_stops_a_retry(
    fake: FakeAnthropic, client: AnthropicClient, sleeper: RecordingSleeper
) -> None:
    fake.script(said(Reply.overloaded(), "false"), Reply.text("never asked for"))

    with pytest.raises(LlmError) as caught:
        await stack(client, sleeper).send(REQUEST)

    assert caught.value.status == 529 and not caught.value.retryable
    assert len(fake.requests) == 1 and sleeper.waits == []


async def test_x_should_retry_true_forces_a_retry(
    fake: FakeAnthropic, client: AnthropicClient, sleeper: RecordingSleeper
) -> None:
    fake.script(said(Reply.bad_request("a transient glitch"), "true"), Reply.text("ok"))

    response = await stack(client, sleeper).send(REQUEST)

    assert response.content == [{"type": "text", "text": "ok"}]
    assert len(fake.requests) == 2 and len(sleeper.waits) == 1


@pytest.mark.parametrize("value", ["inf", "1e12", "-5", "nan", "Fri, 31 Dec 9999 23:59:59 GMT"])
async def test_an_absurd_retry_after_never_parks_the_call(
    fake: FakeAnthropic, client: AnthropicClient, sleeper: RecordingSleeper, value: str
) -> None:
    limited = Reply.rate_limited()
    fake.script(Reply(status=429, body=limited.body, headers={"retry-after": value}), Reply.text("ok"))

    response = await stack(client, sleeper).send(REQUEST)

    assert response.content == [{"type": "text", "text": "ok"}]
    (wait,) = sleeper.waits
    assert 0.0 <= wait <= MAX_RETRY_AFTER, wait


async def test_a_slow_attempt_times_out_and_the_next_one_answers(
    fake: FakeAnthropic, client: AnthropicClient, sleeper: RecordingSleeper
) -> None:
    fake.script(Reply.text("late").after(2.0), Reply.text("on time"))

    response = await stack(client, sleeper, timeout=0.2).send(REQUEST)

    assert response.content == [{"type": "text", "text": "on time"}]
    assert len(fake.requests) == 2 and len(sleeper.waits) == 1


def test_full_jitter_stays_under_the_doubling_ceiling_and_the_cap() -> None:
    rng = random.Random(42)
    for attempt in range(12):
        ceiling = min(8.0, 0.5 * 2**attempt)
        waits = [backoff(attempt, 0.5, 8.0, rng) for _ in range(200)]
        assert all(0 <= w <= ceiling for w in waits)
        assert max(waits) > ceiling * 0.8  # spread over the whole range, not stuck at the bottom


def test_retry_after_is_a_floor_not_a_replacement() -> None:
    class Top:
        def uniform(self, a: float, b: float) -> float:
            return b

    assert backoff(0, 1.0, 30.0, Top(), retry_after=7) == 7.0
    assert backoff(5, 1.0, 30.0, Top(), retry_after=7) == 30.0


@pytest.mark.parametrize(("retry_after", "expected"), [
    (float("inf"), MAX_RETRY_AFTER), (1e12, MAX_RETRY_AFTER), (float("nan"), 0.0), (-3.0, 0.0),
])
def test_backoff_bounds_the_retry_after_it_is_given(retry_after: float, expected: float) -> None:
    class Bottom:
        def uniform(self, a: float, b: float) -> float:
            return a

    assert backoff(0, 1.0, 30.0, Bottom(), retry_after=retry_after) == expected


async def test_errors_other_than_llm_errors_pass_through(sleeper: RecordingSleeper) -> None:
    class Broken:
        async def send(self, request: LlmRequest) -> None:
            raise RuntimeError("bug")

    with pytest.raises(RuntimeError):
        await Retrying(Broken(), sleeper=sleeper).send(REQUEST)  # type: ignore[arg-type]
    assert sleeper.waits == []


def test_at_least_one_attempt() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        Retrying(ScriptedLlm(), max_attempts=0)
