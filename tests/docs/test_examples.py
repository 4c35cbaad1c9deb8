"""Every shell and Python block in README.md and docs/ is run: here, by a test elsewhere that names the page,
or marked not runnable with a reason (tests/docs/examples.py says how a block is marked)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.docs.examples import ROOT, Block, every_block
from tests.support.ports import free_port
from tests.test_dev import Dev

BLOCKS = every_block()
# What `<!-- run: NAME -->` may name. python: the blocks of one page run in order in one interpreter, as a
# reader would. dev: a shell block run with bash against `agentrun dev`, as a reader of the page would after
# `make dev`: `localhost:8080` is the stack's address, `ID` and `$ID` a run of its in flight.
RUNNERS = {"python", "dev"}


def test_every_block_is_run_or_says_why_not() -> None:
    unmarked = [b.where for b in BLOCKS if b.marker is None]
    assert not unmarked, (
        "a shell or Python block that no test runs: have a test run it, or put "
        "`<!-- not-run: the reason -->` on the line above it: " + ", ".join(unmarked))
    for b in BLOCKS:
        if b.marker == "not-run":
            assert len(b.says) >= 20, f"{b.where}: say why it cannot be run"
        if b.marker == "run":
            assert b.says in RUNNERS, f"{b.where}: no runner {b.says!r}"
        if b.marker == "run-by":
            files = b.says.split()
            for name in files:
                assert (ROOT / name).is_file(), f"{b.where}: {name} does not exist"
            page = "README" if b.page == "README.md" else b.page
            assert any(page in (ROOT / name).read_text() for name in files), \
                f"{b.where}: none of {files} names {page}: say there which test runs it"


def _python_pages() -> dict[str, list[Block]]:
    found: dict[str, list[Block]] = defaultdict(list)
    for b in BLOCKS:
        if b.marker == "run" and b.says == "python":
            found[b.page].append(b)
    return dict(found)


@pytest.mark.parametrize("page", sorted(_python_pages()))
def test_the_python_blocks_run(page: str) -> None:
    """The page's Python blocks in order, in a fresh interpreter with the package installed: what they define
    is defined (a @tool registers), and nothing raises."""
    code = "\n".join(b.code for b in _python_pages()[page])
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{page}: {out.stderr[-2000:]}"


DEV_BLOCKS = [b for b in BLOCKS if b.marker == "run" and b.says == "dev"]


@pytest.fixture(scope="module")
def dev_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    dev = Dev(tmp_path_factory.mktemp("dev"), port)
    try:
        dev.wait_for(f"open http://127.0.0.1:{port}/ui/")
        yield f"127.0.0.1:{port}"
    finally:
        assert dev.interrupt() == 0, dev.lines[-20:]


def _run_in_flight(http: httpx.Client) -> str:
    """A run the local model answers slowly (a word a second), once a worker drives it."""
    run_id = str(http.post("/api/runs", json={"input": "[[slow:1]] Which acme tickets are overdue?",
                                              "tokenBudget": 50000, "timeoutSeconds": 300}).json()["id"])
    deadline = time.monotonic() + 90
    while http.get(f"/api/runs/{run_id}").json()["status"] != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return run_id


def _files(page: str) -> dict[str, str]:
    """The blocks of the page that name the file they are, on their first line: `# agent.yaml`."""
    found = {}
    for match in re.finditer(r"^```\w*\n# ([\w.-]+\.(?:yaml|yml|json))\n(.*?)^```", (ROOT / page).read_text(), re.M | re.S):
        found[match.group(1)] = match.group(2)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("block", DEV_BLOCKS, ids=[b.where for b in DEV_BLOCKS])
def test_the_shell_blocks_run_against_dev(block: Block, dev_stack: str, tmp_path: Path) -> None:
    http = httpx.Client(base_url=f"http://{dev_stack}", timeout=30)
    run_id = _run_in_flight(http)
    code = block.code.replace("localhost:8080", dev_stack).replace("$ID", run_id)
    code = re.sub(r"\bID\b", run_id, code)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "AGENTRUN_URL": f"http://{dev_stack}"}
    env.pop("AGENTRUN_API_TOKEN", None)
    for name, text in _files(block.page).items():  # the files the page shows, for its commands to read
        (tmp_path / name).write_text(text)
    # An HTTP error fails the block, as the answer a reader would read would be one.
    code = 'curl() { command curl --fail-with-body "$@"; }\n' + code
    out = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    http.post(f"/api/runs/{run_id}/cancel")
    http.close()
    assert out.returncode == 0, f"{block.where}: {out.stdout[-1000:]}{out.stderr[-2000:]}"
