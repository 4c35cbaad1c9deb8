"""Run labels: Kubernetes' syntax checked at submission (a 422 naming `labels.<key>`), stored, shown, passed
on to continuations and forks; and the label selector's parser, form by form."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from agentrun.worker.core.labels import Selector, parse_selector
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolBox
from tests.support.builders import worker

RUN = {"input": "Which acme tickets are overdue?", "tokenBudget": 50_000, "timeoutSeconds": 300}


def problems(r: httpx.Response) -> dict[str, str]:
    return {p["field"]: p["problem"] for p in r.json()["fields"]}


async def test_labels_are_stored_and_shown(client: httpx.AsyncClient) -> None:
    labels = {"team": "billing", "example.com/owner": "ana", "empty": "", "a.b-c_d": "X.y-z_9"}
    r = await client.post("/api/runs", json={**RUN, "labels": labels})
    assert r.status_code == 201, r.text
    run = (await client.get(f"/api/runs/{r.json()['id']}")).json()
    assert run["labels"] == labels
    plain = (await client.post("/api/runs", json=RUN)).json()
    assert (await client.get(f"/api/runs/{plain['id']}")).json()["labels"] == {}


@pytest.mark.parametrize(("labels", "field"), [
    ({"-team": "x"}, "labels.-team"),
    ({"team-": "x"}, "labels.team-"),
    ({"": "x"}, "labels."),
    ({"t" * 64: "x"}, "labels." + "t" * 64),
    ({"Example.com/team": "x"}, "labels.Example.com/team"),
    ({"/team": "x"}, "labels./team"),
    ({"a/b/c": "x"}, "labels.a/b/c"),
    ({"team": "bad value"}, "labels.team"),
    ({"team": "v" * 64}, "labels.team"),
    ({"team": "-x"}, "labels.team"),
    ({"team": "caf\u00e9"}, "labels.team"),
])
async def test_a_bad_label_is_a_422_naming_it(client: httpx.AsyncClient, labels: dict[str, str], field: str) -> None:
    r = await client.post("/api/runs", json={**RUN, "labels": {"ok": "fine", **labels}})
    assert r.status_code == 422, r.text
    assert set(problems(r)) == {field}, r.text
    assert (await client.get("/api/runs")).json()["items"] == []


@pytest.mark.parametrize("labels", [{"team": 5}, {"team": None}, ["team"], "team=billing"])
async def test_labels_of_the_wrong_shape_are_a_422(client: httpx.AsyncClient, labels: Any) -> None:
    r = await client.post("/api/runs", json={**RUN, "labels": labels})
    assert r.status_code == 422, r.text
    assert any(f.startswith("labels") for f in problems(r)), r.text


async def test_too_many_labels_are_a_422(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/runs", json={**RUN, "labels": {f"k{i}": "v" for i in range(65)}})
    assert r.status_code == 422 and "labels" in problems(r), r.text


async def test_continue_and_fork_keep_the_parents_labels_unless_given(
    client: httpx.AsyncClient, store: RunStore, toolbox: ToolBox
) -> None:
    parent = (await client.post("/api/runs", json={**RUN, "labels": {"team": "billing"}})).json()["id"]
    await worker(store, ScriptedLlm().then_text("done", 10, 5), toolbox).run_once()
    cont = await client.post("/api/runs", json={"continueFrom": parent, "input": "more"})
    fork = await client.post("/api/runs", json={"forkFrom": {"runId": parent, "seq": 1}})
    own = await client.post("/api/runs", json={"continueFrom": parent, "input": "more", "labels": {"team": "ops"}})
    cleared = await client.post("/api/runs", json={"forkFrom": {"runId": parent, "seq": 1}, "labels": {}})
    bad = await client.post("/api/runs", json={"continueFrom": parent, "input": "more", "labels": {"t": "a b"}})
    assert bad.status_code == 422 and "labels.t" in problems(bad)
    for r, labels in ((cont, {"team": "billing"}), (fork, {"team": "billing"}), (own, {"team": "ops"}),
                      (cleared, {})):
        assert r.status_code == 201, r.text
        assert (await client.get(f"/api/runs/{r.json()['id']}")).json()["labels"] == labels


async def test_an_idempotent_retry_with_other_labels_is_refused(client: httpx.AsyncClient) -> None:
    key = {"Idempotency-Key": "labels-1"}
    first = await client.post("/api/runs", json={**RUN, "labels": {"a": "1"}}, headers=key)
    again = await client.post("/api/runs", json={**RUN, "labels": {"a": "1"}}, headers=key)
    other = await client.post("/api/runs", json={**RUN, "labels": {"a": "2"}}, headers=key)
    assert first.status_code == again.status_code == 201 and first.json()["id"] == again.json()["id"]
    assert other.status_code == 422 and "Idempotency-Key" in problems(other)


# -- the selector parser, form by form ------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("team=billing", Selector(equal={"team": "billing"})),
    ("team==billing", Selector(equal={"team": "billing"})),
    ("team=", Selector(equal={"team": ""})),
    ("env!=prod", Selector(not_equal=[("env", "prod")])),
    ("tier in (a,b)", Selector(within=[("tier", ["a", "b"])])),
    ("tier in ( a , b )", Selector(within=[("tier", ["a", "b"])])),
    ("tier notin (c)", Selector(without=[("tier", ["c"])])),
    ("key", Selector(present=["key"])),
    ("!key", Selector(absent=["key"])),
    ("! key", Selector(absent=["key"])),
    ("example.com/app=x", Selector(equal={"example.com/app": "x"})),
    ("a=1,a=2", Selector(equal={"a": "1"}, within=[("a", ["2"])])),
    ("team=billing,env!=prod,tier in (a,b),tier notin (c),key,!other", Selector(
        equal={"team": "billing"}, not_equal=[("env", "prod")], within=[("tier", ["a", "b"])],
        without=[("tier", ["c"])], present=["key"], absent=["other"])),
])
def test_selector_forms(text: str, expected: Selector) -> None:
    assert parse_selector(text) == expected


@pytest.mark.parametrize("text", [
    "", "  ", ",", "team=billing,", ",team", "team in (a", "team in a", "team in ()", "team in (a b)",
    "=x", "!", "!=x", "a b", "team=a=b", "team=bad value", "team=-x", "-team", "in (a)", "team in (a,)",
    "team ~ x", "team=(x)", "t" * 64, "Upper.Prefix/x",
])
def test_bad_selectors(text: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_selector(text)
    assert str(e.value)
