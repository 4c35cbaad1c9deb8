"""The submission policy (worker/core/submission.py): defaults, inheritance from a source, and checks; and
that every other statement of a default (CRD, chart's copy of it, settings, the API's schema) is this one."""

from __future__ import annotations

import ast
import dataclasses
import datetime
import json
import pathlib
import subprocess
import sys
import uuid
from decimal import Decimal
from typing import Any

import pytest
import yaml

from agentrun.worker.api.schemas import RunRequest
from agentrun.worker.core import submission
from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.records import NewRun, Run, RunStatus
from agentrun.worker.core.submission import Defaults, Offer, Refusal, Refused, RunSpec
from agentrun.worker.settings import WorkerSettings

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOW = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
SOURCE_ID = uuid.UUID("00000000-0000-0000-0000-0000000000aa")


def _source(**kw: Any) -> Run:
    fields: dict[str, Any] = dict(
        id=SOURCE_ID, status=RunStatus.SUCCEEDED, input="first", model="claude-haiku-4-5", system="be brief",
        tools=("lookup",), token_budget=5000, tokens_used=10, cost_budget_usd=Decimal("0.5"),
        cost_usd=Decimal("0"), max_steps=7, timeout_seconds=30, deadline_at=NOW, cancel_requested=False,
        error=None, locked_by=None, locked_until=None, created_at=NOW, started_at=NOW, finished_at=NOW, steps=3,
        require_approval=("lookup",), output_schema={"type": "object"}, priority=5,
    )
    fields.update(kw)
    return Run(**fields)


@pytest.mark.parametrize("crd", ["crds/agentrun.yaml", "charts/agentrun/crds/agentrun.yaml"])
def test_the_crd_leaves_the_defaults_to_the_policy_and_names_them(crd: str) -> None:
    """No schema defaults (they would override an agent's or a source's values): the operator applies the
    policy's; the CRD's descriptions, which cannot import Python, name them and are held equal here."""
    (version,) = yaml.safe_load((ROOT / crd).read_text())["spec"]["versions"]
    props = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    policy = {"model": submission.DEFAULT_MODEL, "tokenBudget": submission.DEFAULT_TOKEN_BUDGET,
              "timeoutSeconds": submission.DEFAULT_TIMEOUT_SECONDS, "maxSteps": submission.DEFAULT_MAX_STEPS}
    for field, default in policy.items():
        assert "default" not in props[field], field
        assert f" or {default}" in " ".join(props[field]["description"].split()), field


def test_every_python_default_is_the_policys() -> None:
    # NewRun's own default (for store-level callers) cannot import the policy, which builds NewRuns.
    assert {f.name: f.default for f in dataclasses.fields(NewRun)}["max_steps"] == submission.DEFAULT_MAX_STEPS
    assert WorkerSettings(database_url="unused").default_model == submission.DEFAULT_MODEL
    assert RunRequest.model_fields["max_steps"].default == submission.DEFAULT_MAX_STEPS
    assert Defaults() == Defaults(submission.DEFAULT_MODEL, submission.DEFAULT_MAX_STEPS,
                                  submission.DEFAULT_TOKEN_BUDGET, submission.DEFAULT_TIMEOUT_SECONDS)


def test_a_new_run_gets_the_defaults() -> None:
    new = submission.new_run(RunSpec(input="hi"), None)
    assert (new.input, new.model, new.token_budget, new.timeout_seconds, new.max_steps) == (
        "hi", "claude-sonnet-4-6", 100_000, 600, 100)
    assert (new.tools, new.system, new.cost_budget_usd, new.require_approval, new.priority) == (None,) * 4 + (0,)


def test_without_default_budgets_a_new_run_must_name_them() -> None:
    with pytest.raises(Refused) as caught:
        submission.new_run(RunSpec(), None, Defaults(token_budget=None, timeout_seconds=None))
    assert caught.value.kind is Refusal.INVALID
    assert [p.field for p in caught.value.problems] == ["input", "tokenBudget", "timeoutSeconds"]


def test_a_continuation_inherits_what_it_leaves_out_but_not_the_schedule() -> None:
    new = submission.new_run(RunSpec(input="more", continue_from=SOURCE_ID), _source())
    assert new.continue_from == SOURCE_ID and new.input == "more"
    assert (new.model, new.token_budget, new.timeout_seconds, new.max_steps, new.tools, new.system) == (
        "claude-haiku-4-5", 5000, 30, 7, ("lookup",), "be brief")
    assert (new.cost_budget_usd, new.require_approval, new.output_schema) == (
        Decimal("0.5"), ("lookup",), {"type": "object"})
    assert new.priority == 0  # a schedule is the request's own


def test_what_a_continuation_names_beats_its_source() -> None:
    spec = RunSpec(input="more", continue_from=SOURCE_ID, model="m2", token_budget=9, max_steps=2, tools=())
    new = submission.new_run(spec, _source())
    assert (new.model, new.token_budget, new.max_steps, new.tools, new.timeout_seconds) == ("m2", 9, 2, (), 30)


def test_a_fork_takes_its_sources_input() -> None:
    new = submission.new_run(RunSpec(fork_from=(SOURCE_ID, 2)), _source(status=RunStatus.FAILED))
    assert (new.input, new.fork_from, new.token_budget) == ("first", (SOURCE_ID, 2), 5000)


@pytest.mark.parametrize(("spec", "source", "kind", "field"), [
    (RunSpec(input="x", continue_from=SOURCE_ID), _source(status=RunStatus.FAILED), Refusal.CONFLICT, None),
    (RunSpec(fork_from=(SOURCE_ID, 4)), _source(), Refusal.UNFIT, "forkFrom.seq"),
    (RunSpec(input="x", fork_from=(SOURCE_ID, 1)), _source(), Refusal.INVALID, "input"),
    (RunSpec(continue_from=SOURCE_ID), _source(), Refusal.INVALID, "input"),
    (RunSpec(input="x", continue_from=SOURCE_ID), None, Refusal.INVALID, "continueFrom"),
    (RunSpec(input="x", tools=("lookup", "teleport")), None, Refusal.INVALID, "tools[1]"),
    (RunSpec(input="x", require_approval=("*", "teleport")), None, Refusal.INVALID, "requireApproval[1]"),
    (RunSpec(input="x", output_schema={"type": "integr"}), None, Refusal.UNFIT, "outputSchema"),
    (RunSpec(input="x", model="claude-imaginary-9", cost_budget_usd=Decimal(1)), None, Refusal.UNFIT,
     "costBudgetUsd"),
    (RunSpec(input="x", model="gemini/x"), None, Refusal.UNFIT, "model"),
])
def test_refusals(spec: RunSpec, source: Run | None, kind: Refusal, field: str | None) -> None:
    offer = Offer(has_tool={"lookup"}.__contains__, tool_names=["lookup"], prices=PriceTable.load(),
                  model_problem=lambda m: "unknown provider" if m.startswith("gemini/") else None)
    with pytest.raises(Refused) as caught:
        submission.new_run(spec, source, offer=offer)
    assert caught.value.kind is kind
    assert [p.field for p in caught.value.problems][:1] == ([field] if field else [])
    assert caught.value.message


def test_the_charts_default_model_is_the_policys() -> None:
    values = yaml.safe_load((ROOT / "charts" / "agentrun" / "values.yaml").read_text())
    assert values["config"]["defaultModel"] == submission.DEFAULT_MODEL


def test_the_policy_is_pure() -> None:
    """No I/O library, nothing of ours outside worker/core/: both the API and the operator import it."""
    code = "import sys, json, agentrun.worker.core.submission; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    loaded = set(json.loads(out.stdout))
    io = {"psycopg", "psycopg_pool", "anthropic", "httpx", "aiohttp", "kopf", "kubernetes", "fastapi", "uvicorn"}
    assert not {m for m in loaded if m.split(".")[0] in io}
    # Its own imports (importing anything of agentrun.worker also runs the package's __init__, tools and all).
    tree = ast.parse((ROOT / "worker" / "core" / "submission.py").read_text())
    ours = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("agentrun")}
    assert ours and all(f"{m}.".startswith("agentrun.worker.core.") for m in ours), sorted(ours)
