"""An AgentRun's metadata.labels are its run's labels, so the runs list finds it by the selector kubectl
does; a continuation without labels of its own keeps its source's."""

from __future__ import annotations

import pytest

from agentrun.worker.core.labels import parse_selector
from agentrun.worker.store import RunFilter, RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from tests.support.builders import worker
from tests.support.cluster import Cluster, run_row

pytestmark = pytest.mark.usefixtures("operator")


async def test_metadata_labels_are_mirrored_into_the_run(cluster: Cluster, store: RunStore) -> None:
    labels = {"team": "billing", "app.kubernetes.io/part-of": "invoices"}
    source = await run_row(store, await cluster.create("labelled", labels=labels, input="Say hello"))
    assert source.labels == labels
    plain = await run_row(store, await cluster.create("plain", input="Say hello"))
    assert plain.labels == {}
    where = RunFilter(selector=parse_selector("team=billing,app.kubernetes.io/part-of in (invoices)"))
    assert [r.id for r in await store.list_runs(where=where)] == [source.id]

    assert await worker(store, ScriptedLlm().then_text("hello", in_=10, out=5)).run_once() == source.id
    await cluster.wait_status("labelled", "Succeeded", lambda s: s.get("phase") == "Succeeded")
    cont = await run_row(store, await cluster.create("next", input="and then?", continueFrom="labelled"))
    assert cont.labels == labels  # none of its own: its source's
    own = await run_row(store, await cluster.create("own", labels={"team": "ops"}, input="more",
                                                    continueFrom="labelled"))
    assert own.labels == {"team": "ops"}
