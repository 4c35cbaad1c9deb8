"""The order a stream gives a watcher: a model call's text never comes before the steps it follows.

The worker writes step N-1 and only then calls the model for step N, so its text is published after that
commit; but the events API reads rows once their notification is in and the horizon has passed them,
while text is passed on as it arrives. Seen as `agentrun runs watch` printing the final answer's first
words before the tool step it summarises, under load (tests/api/test_events.py, runs_watch_prints...).
"""

from __future__ import annotations

import uuid

from agentrun.worker.api.events import RUN, STEP, Batch, Event, Subscriber


def _step(position: int, seq: int) -> Event:
    return Event((position, STEP, seq), "step", {"seq": seq, "status": "DONE"})


def test_text_of_the_next_call_waits_for_the_step_before_it() -> None:
    sub = Subscriber(uuid.uuid4())
    sub.offer(Batch([_step(5, 1)], settling=False, terminal=False, status="RUNNING", steps=1))
    assert [e.position[2] for e in sub.take_events()] == [1]
    sub.delta(3, "Summary ")  # step 2 (a tool) is committed, its row not read yet
    assert sub.take_deltas() == [] and not sub.deltas_ready
    sub.delta(3, "of lookup")
    sub.offer(Batch([_step(9, 2)], settling=False, terminal=False, status="RUNNING", steps=2))
    assert sub.take_deltas() == []  # still: the step is offered, not yet given to the client
    assert [e.position[2] for e in sub.take_events()] == [2]
    assert sub.deltas_ready and sub.take_deltas() == [(3, "Summary of lookup")]


def test_text_of_the_call_after_the_last_given_step_goes_at_once() -> None:
    sub = Subscriber(uuid.uuid4())
    # A stream that begins mid-run: its first batch says the run had two steps.
    sub.offer(Batch([Event((7, RUN, 0), "run", {"steps": 2})], settling=False, terminal=False, status="RUNNING",
                    steps=2))
    sub.delta(3, "Hello")
    assert sub.take_deltas() == []  # not before the first batch itself
    sub.take_events()
    assert sub.take_deltas() == [(3, "Hello")]
    sub.delta(3, " world")  # and the text of the step being streamed, while its row is not written
    assert sub.take_deltas() == [(3, " world")]


def test_a_resumed_stream_that_was_given_every_step_gets_the_text_at_once() -> None:
    sub = Subscriber(uuid.uuid4(), seen=(40, RUN, 0))
    sub.offer(Batch([], settling=False, terminal=False, status="RUNNING", steps=4))  # nothing new since
    sub.take_events()
    sub.delta(5, "go on")
    assert sub.take_deltas() == [(5, "go on")]
