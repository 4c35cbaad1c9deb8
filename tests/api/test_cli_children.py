"""`agentrun runs get / children / list --parent` for a tree of sub-agent runs, against a real uvicorn
server over real PostgreSQL."""

from __future__ import annotations

import json
import uuid

import pytest

from agentrun.worker.cli.client import agent_of, tree_text
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import TreeLlm
from tests.support.builders import worker
from tests.support.cli import agentrun
from tests.support.running import finished, running
from tests.support.trees import child_ids, define, finished_tree, planner, tree_at_work

pytestmark = pytest.mark.usefixtures("restore_logging")


async def test_get_shows_the_tree_and_a_child_its_parent(
    store: RunStore, server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A planner whose first sub-agent is itself a planner with a sub-agent: a grandchild.
    lead = await define(store, "lead", sub_agents=(await define(store, "digger"),))
    parent = await planner(store, "writer")
    async with store.pool.connection() as conn:
        await conn.execute("UPDATE run SET sub_agents = %s WHERE id = %s", ([lead, "writer@1"], parent.id))
    async with running(worker(store, TreeLlm(), concurrency=4)):
        done = await finished(store, parent.id, 60)
    assert done.status.value == "SUCCEEDED", done.error
    lead_id, writer_id = await child_ids(store, parent.id)
    (digger_id,) = await child_ids(store, uuid.UUID(lead_id))

    code, out, err = await agentrun(capsys, "runs", "get", str(parent.id), "--url", server_url)
    assert code == 0, err
    lines = out.splitlines()
    start = lines.index("children (2):")
    rows = [line.split() for line in lines[start + 1:start + 4]]
    assert [r[0] for r in rows] == [lead_id, digger_id, writer_id]
    assert lines[start + 2].index(digger_id) == lines[start + 1].index(lead_id) + 2  # the grandchild indented
    assert all(r[2] == "SUCCEEDED" and r[4] == "tokens" and r[5].startswith("$") for r in rows)
    children = {c.id: c for c in await store.children(parent.id)}
    assert rows[0][3] == str(children[uuid.UUID(lead_id)].tokens_used_total)  # the lead's own tree's tokens
    assert rows[0][1] in ("lead@1", "-")  # `-` until the run JSON names its agent (branch agents)
    total = lines[start + 4]
    assert total.startswith(f"totals: {done.tokens_used_total} tokens, $") and f"(own: {done.tokens_used} tokens" in total

    code, out, _ = await agentrun(capsys, "runs", "get", digger_id, "--url", server_url)
    assert code == 0
    details = dict(line.split("  ", 1) for line in out.splitlines() if "  " in line and not line.startswith(" "))
    assert details["started by"].strip() == f"run {lead_id} for call toolu_0_agent__digger"
    assert "children (" not in out and "totals:" not in out  # a leaf has neither

    code, out, _ = await agentrun(capsys, "runs", "get", str(parent.id), "--url", server_url, "--json")
    run = json.loads(out)  # the run's JSON alone
    assert (run["id"], run["rootRunId"], run["tokensUsedTotal"]) == (str(parent.id), str(parent.id),
                                                                     done.tokens_used_total)


async def test_children_and_list_parent(store: RunStore, server_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    parent = await finished_tree(store, "researcher", "writer")
    ids = await child_ids(store, parent.id)
    code, out, err = await agentrun(capsys, "runs", "children", str(parent.id), "--url", server_url)
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split() == ["ID", "AGENT", "CALL", "STATUS", "TOKENS", "COST", "ACTIVE", "ERROR"]
    assert [(r.split()[0], r.split()[2], r.split()[3]) for r in rows] == [
        (ids[0], "toolu_0_agent__researcher", "SUCCEEDED"), (ids[1], "toolu_1_agent__writer", "SUCCEEDED")]
    code, out, _ = await agentrun(capsys, "runs", "children", str(parent.id), "--url", server_url, "--json")
    assert [c["id"] for c in json.loads(out)] == ids
    code, out, _ = await agentrun(capsys, "runs", "children", ids[0], "--url", server_url)
    assert (code, out.strip()) == (0, "no children")

    code, out, err = await agentrun(capsys, "runs", "list", "--parent", str(parent.id), "--url", server_url,
                                    "--limit", "1")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].split()[0] == ids[1] and lines[-1] == f"more: --after {ids[1]} (or --all)"
    code, out, _ = await agentrun(capsys, "runs", "list", "--parent", str(parent.id), "--url", server_url,
                                  "--after", ids[1], "--json")
    assert [r["id"] for r in json.loads(out)["items"]] == [ids[0]]


async def test_a_waiting_parent_says_it_waits_for_its_sub_agents(
    store: RunStore, server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with tree_at_work(store, "researcher", "writer") as (parent, hold):
        code, out, err = await agentrun(capsys, "runs", "get", str(parent.id), "--url", server_url)
        assert code == 0, err
        assert "for its sub-agents: 2 at work" in out and out.count("RUNNING") == 2
        assert "decisions" not in out  # nothing waits for a person
        code, out, _ = await agentrun(capsys, "runs", "pending", str(parent.id), "--url", server_url)
        assert [line.split()[2] for line in out.splitlines()[1:]] == ["children", "children"]
        hold.set()


@pytest.mark.parametrize("argv", [
    ("children", "../../metrics"), ("children", "nope"), ("list", "--parent", "x?y=1"),
    ("list", "--parent", "\x1b[2J"),
])
async def test_hostile_ids_are_refused_before_any_request(
    server_url: str, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    code, out, err = await agentrun(capsys, "runs", *argv, "--url", server_url)
    assert code == 1 and out == ""
    assert "is not a valid UUID" in err and "\x1b" not in err


async def test_unknown_run_children_is_an_error(server_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = await agentrun(capsys, "runs", "children", str(uuid.uuid4()), "--url", server_url)
    assert code == 1 and "no run with id" in err


def test_the_tree_text_names_each_agent_when_the_run_json_does() -> None:
    child = {"id": "c1", "agent": "researcher", "agentVersion": 2, "status": "RUNNING", "tokensUsedTotal": 7,
             "costUsdTotal": 0.5}
    assert agent_of(child) == "researcher@2" and agent_of({"id": "x"}) == "-"
    text = tree_text({"tokensUsed": 3, "costUsd": 0.0, "tokensUsedTotal": 10, "costUsdTotal": 0.5}, [(1, child)])
    assert text.splitlines()[1].split() == ["c1", "researcher@2", "RUNNING", "7", "tokens", "$0.5000"]
