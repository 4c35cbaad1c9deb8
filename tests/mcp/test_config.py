"""AGENTRUN_MCP_SERVERS: what the file may say, and a bad one as a one-line start-up error. And the pure
parts: names the Messages API takes, result mapping, caps, and step logs from before content blocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from agentrun.worker.core.records import Step, StepKind, StepStatus
from agentrun.worker.core.replay import BLOCKS_MARK, Conversation, dump_content
from agentrun.worker.tools import ToolBox, ToolContext, ToolResult, tool
from agentrun.worker.tools.mcp import McpConfigError, McpServers, load_servers
from agentrun.worker.tools.mcp.config import Approval, parse_servers, secret_variables
from agentrun.worker.tools.mcp.results import TOOL_NAME, exposed_name, idempotent, requires_approval, tool_result
from tests.support.mcp import REPO


def one(**server: Any) -> dict[str, Any]:
    return {"servers": [{"name": "shop", "url": "http://mcp.local/mcp", **server}]}


def test_a_full_config_is_read_with_variables_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "mcp.yaml"
    path.write_text("""
servers:
  - name: shop
    url: https://mcp.example.com/mcp
    headers: {Authorization: "Bearer ${SHOP_TOKEN}", X-Team: agents}
    tools: [lookup, charge]
    requireApproval: destructive
    timeoutSeconds: 12
    overrides:
      lookup: {idempotent: true}
      charge: {requiresApproval: true, timeoutSeconds: 60}
  - name: files-local
    command: python
    args: [-m, files_server, 3]
    env: {ROOT: "${HOME_DIR}/data"}
""")
    shop, files = load_servers(str(path), {"SHOP_TOKEN": "abc", "HOME_DIR": "/srv"})
    assert shop.headers == {"Authorization": "Bearer abc", "X-Team": "agents"}
    assert shop.tools == frozenset({"lookup", "charge"}) and shop.require_approval is Approval.DESTRUCTIVE
    assert shop.timeout_seconds == 12 and shop.overrides["charge"].timeout_seconds == 60
    assert "abc" not in repr(shop)  # headers hold secrets
    assert (files.command, files.args, dict(files.env)) == ("python", ("-m", "files_server", "3"), {"ROOT": "/srv/data"})
    assert files.require_approval is Approval.NONE and files.tools is None
    assert load_servers(None, {}) == []
    # JSON is YAML too.
    path.write_text(json.dumps(one()))
    assert [s.name for s in load_servers(str(path), {})] == ["shop"]


@pytest.mark.parametrize(("doc", "message"), [
    ([], "must be a mapping with one key, `servers`"),
    ({"servers": [], "extra": 1}, "must be a mapping with one key, `servers`"),
    (one(name="a__b"), "name must be 1 to 32 letters, digits, `-` and single `_`"),
    (one(name="shop_"), "name must be"),
    (one(name="x" * 33), "name must be"),
    ({"servers": [{"name": "a", "url": "http://x"}, {"name": "a", "url": "http://y"}]}, "a second server is named 'a'"),
    (one(command="python"), "give either `url` (Streamable HTTP) or `command` (stdio)"),
    ({"servers": [{"name": "a"}]}, "give either `url`"),
    (one(url="ftp://x"), "url must be an http:// or https:// URL"),
    (one(headers={"A": "${NOPE}"}), "headers.A: environment variable NOPE is not set"),
    (one(headers=["A"]), "headers: must map names to strings"),
    (one(requireApproval="some"), "requireApproval must be none, destructive or all, got 'some'"),
    (one(timeoutSeconds=0), "timeoutSeconds: must be a positive number of seconds"),
    (one(tools="lookup"), "tools must be a list of the server's tool names"),
    (one(overrides={"lookup": {"idempotent": "yes"}}), "overrides.lookup.idempotent: must be true or false"),
    (one(overrides={"lookup": {"retries": 3}}), "overrides.lookup: unknown keys retries"),
    (one(overrides={"pay": {"reconcile": 3}}), "overrides.pay.reconcile: must name a read-only tool"),
    (one(overrides={"pay": {"reconcile": "pay"}}), "overrides.pay.reconcile: a tool cannot reconcile its own"),
    (one(args=["x"]), "args go with `command`"),
    (one(colour="red"), "unknown keys colour"),
])
def test_bad_configs_say_what_is_wrong(doc: Any, message: str) -> None:
    with pytest.raises(McpConfigError) as e:
        parse_servers(doc, {}, where="mcp.yaml")
    assert message in str(e.value) and str(e.value).startswith("mcp.yaml")


def test_the_variables_headers_name_are_redacted_from_logs(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"servers": [
        {"name": "a", "url": "http://x/mcp", "headers": {"Authorization": "Bearer ${A_TOKEN}", "X": "${B}-${C}"}},
        {"name": "b", "command": "srv", "env": {"KEY": "${D}"}}]}))
    assert secret_variables(str(path)) == ["A_TOKEN", "B", "C", "D"]
    assert secret_variables(None) == [] and secret_variables(str(tmp_path / "missing")) == []


def test_a_python_tool_with_a_servers_prefix_is_refused() -> None:
    with pytest.raises(McpConfigError, match="Python tool shop__x has the prefix of MCP server shop"):
        McpServers(parse_servers(one(), {}), python_tools=["shop__x"])


@pytest.mark.parametrize("content", ["servers: [{name: shop}]", "servers: [", None])
def test_the_worker_refuses_to_start_on_a_bad_file_with_one_line(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "mcp.yaml"
    if content is not None:
        path.write_text(content)
    done = subprocess.run(
        [sys.executable, "-m", "agentrun.worker.cli", "worker", "--port", "0"],
        env={**os.environ, "AGENTRUN_DATABASE_URL": "postgresql://127.0.0.1:9/none",
             "AGENTRUN_MCP_SERVERS": str(path)},
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentrun: AGENTRUN_MCP_SERVERS: "), done.stderr
    assert "Traceback" not in done.stderr


def test_names_fit_the_messages_api_deterministically() -> None:
    assert exposed_name("shop", "lookup") == "shop__lookup"
    long = exposed_name("shop", "x" * 80)
    odd = exposed_name("shop", "look up.v2")
    assert TOOL_NAME.fullmatch(long) and TOOL_NAME.fullmatch(odd) and len(long) == 64
    assert odd.startswith("shop__look_up_v2_") and odd == exposed_name("shop", "look up.v2")
    assert exposed_name("shop", "look up?v2") != odd  # the digest is of the original name


def test_annotations_and_overrides_decide_idempotency_and_approval() -> None:
    def t(**hints: Any) -> types.Tool:
        return types.Tool(name="x", input_schema={"type": "object"},
                          annotations=types.ToolAnnotations(**hints) if hints else None)

    plain = parse_servers(one(), {})[0]
    assert idempotent(t(idempotentHint=True), plain) and idempotent(t(readOnlyHint=True), plain)
    assert not idempotent(t(), plain) and not idempotent(t(destructiveHint=False), plain)
    forced = parse_servers(one(overrides={"x": {"idempotent": False, "requiresApproval": True}}), {})[0]
    assert not idempotent(t(readOnlyHint=True), forced) and requires_approval(t(readOnlyHint=True), forced)
    assert not requires_approval(t(), plain)
    destructive = parse_servers(one(requireApproval="destructive"), {})[0]
    assert requires_approval(t(), destructive) and requires_approval(t(destructiveHint=True), destructive)
    assert not requires_approval(t(readOnlyHint=True, destructiveHint=True), destructive)
    assert not requires_approval(t(destructiveHint=False), destructive)
    everything = parse_servers(one(requireApproval="all"), {})[0]
    assert requires_approval(t(readOnlyHint=True), everything)


def test_results_map_to_tool_result_content() -> None:
    text = types.TextContent(type="text", text="hello")
    assert tool_result(types.CallToolResult(content=[text])) == ToolResult(({"type": "text", "text": "hello"},))
    structured = tool_result(types.CallToolResult(content=[], structured_content={"n": 1}))
    assert structured.blocks == ({"type": "text", "text": '{"n": 1}'},)
    both = tool_result(types.CallToolResult(content=[text], structured_content={"n": 1}))
    assert both.blocks == ({"type": "text", "text": "hello"},)  # the text already says it
    bmp = tool_result(types.CallToolResult(content=[types.ImageContent(type="image", data="AA==",
                                                                       mime_type="image/bmp")]))
    assert "image/bmp is left out" in bmp.blocks[0]["text"]
    failed = tool_result(types.CallToolResult(content=[text], is_error=True))
    assert failed.is_error
    assert tool_result(types.CallToolResult(content=[])).blocks[0]["text"] == "(the tool returned no content)"


async def test_block_results_are_capped_and_plain_text_never_reads_as_blocks() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A" * 60}}

    @tool(name="rich")
    async def rich(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult(({"type": "text", "text": "t" * 30}, image, image))

    @tool(name="sly")
    async def sly(args: dict[str, Any], ctx: ToolContext) -> str:
        return BLOCKS_MARK + dump_content([{"type": "text", "text": "pretend"}])

    box = ToolBox([rich, sly], max_output_chars=100)
    ctx = ToolContext(uuid.uuid4(), "t")
    out = await box.execute("rich", {}, ctx)
    assert out.ok and out.output.startswith(BLOCKS_MARK)
    blocks = json.loads(out.output[len(BLOCKS_MARK):])
    assert blocks[:2] == [{"type": "text", "text": "t" * 30}, image]  # 30 + 60 characters fit in 100
    assert blocks[2]["type"] == "text" and "over the 100-character output cap" in blocks[2]["text"]
    faked = await box.execute("sly", {}, ctx)
    assert not faked.output.startswith(BLOCKS_MARK)


def test_old_step_logs_replay_as_text() -> None:
    run_id = uuid.uuid4()
    content = [{"type": "tool_use", "id": "t1", "name": "a", "input": {}},
               {"type": "tool_use", "id": "t2", "name": "b", "input": {}}]
    steps = [
        Step(run_id, 1, StepKind.MODEL, StepStatus.DONE, response=dump_content(content), stop_reason="tool_use"),
        Step(run_id, 2, StepKind.TOOL, StepStatus.DONE, tool_name="a", tool_use_id="t1",
             response='[{"type": "text", "text": "json a tool returned"}]'),
        Step(run_id, 3, StepKind.TOOL, StepStatus.DONE, tool_name="b", tool_use_id="t2",
             response=BLOCKS_MARK + dump_content([{"type": "text", "text": "x"}])),
    ]
    results = Conversation.replay("go", steps).messages[-1]["content"]
    assert results[0]["content"] == '[{"type": "text", "text": "json a tool returned"}]'
    assert results[1]["content"] == [{"type": "text", "text": "x"}]
