"""An AgentRun's run comes through the one door and records it came by the operator: a new run, and a
continuation of another AgentRun's (the API's ways in are in tests/api/test_origin.py)."""

from __future__ import annotations

import pytest

from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from tests.support.builders import worker
from tests.support.cluster import Cluster, run_row

pytestmark = pytest.mark.usefixtures("operator")


async def test_an_agentrun_records_the_operator_as_its_origin(cluster: Cluster, store: RunStore) -> None:
    first = await run_row(store, await cluster.create("first", input="Say hello"))
    assert first.origin == "operator"
    assert await worker(store, ScriptedLlm().then_text("hello", in_=10, out=5)).run_once() == first.id
    await cluster.wait_status("first", "Succeeded", lambda s: s.get("phase") == "Succeeded")
    after = await run_row(store, await cluster.create("next", input="and then?", continueFrom="first"))
    assert after.origin == "operator" and after.parent_run_id == first.id
