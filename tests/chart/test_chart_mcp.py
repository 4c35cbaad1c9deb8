"""The chart's MCP servers: the file the workers read, mounted in workers and operator, secrets from Secrets."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from agentrun.worker.cli.operator import with_mcp_tools as _with_mcp_tools
from agentrun.worker.tools.mcp.config import Approval, parse_servers
from tests.chart.secret_refs import secret_refs
from tests.support.chart import find

Render = Callable[..., list[dict[str, Any]]]

VALUES = {
    "mcp": {
        "servers": [
            {"name": "github", "url": "http://github-mcp.tools.svc:8080/mcp",
             "headers": {"Authorization": "Bearer ${GITHUB_MCP_TOKEN}"}, "tools": ["search_issues", "create_issue"],
             "requireApproval": "destructive", "overrides": {"search_issues": {"idempotent": True}}},
            {"name": "files", "command": "files-mcp", "args": ["--root", "/data"], "timeoutSeconds": 5},
        ],
        "env": [{"env": "GITHUB_MCP_TOKEN", "existingSecret": "github-mcp", "secretKey": "token"}],
    },
}


def _pod(manifests: list[dict[str, Any]], component: str) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = find(manifests, "Deployment", f"-{component}")["spec"]["template"]["spec"]
    return pod, next(c for c in pod["containers"] if c["name"] == component)


def test_the_servers_file_is_what_the_worker_reads(render: Render, tmp_path: Path) -> None:
    values = tmp_path / "mcp.yaml"
    values.write_text(yaml.safe_dump(VALUES))
    manifests = render(values)
    config = find(manifests, "ConfigMap", "-config")["data"]
    assert config["AGENTRUN_MCP_SERVERS"] == "/etc/agentrun-mcp/servers.json"
    text = find(manifests, "ConfigMap", "-mcp")["data"]["servers.json"]
    github, files = parse_servers(yaml.safe_load(text), {"GITHUB_MCP_TOKEN": "t0k"})  # the worker's own parser
    assert github.headers == {"Authorization": "Bearer t0k"} and github.require_approval is Approval.DESTRUCTIVE
    assert github.overrides["search_issues"].idempotent is True
    assert (files.command, files.args, files.timeout_seconds) == ("files-mcp", ("--root", "/data"), 5.0)
    assert "t0k" not in str(manifests)
    for component in ("worker", "operator"):
        pod, container = _pod(manifests, component)
        assert {"name": "mcp", "mountPath": "/etc/agentrun-mcp", "readOnly": True} in container["volumeMounts"]
        volume = next(v for v in pod["volumes"] if v["name"] == "mcp")
        assert volume["configMap"]["name"].endswith("-mcp")
    pod, worker = _pod(manifests, "worker")
    assert secret_refs(pod, worker)["GITHUB_MCP_TOKEN"] == ("github-mcp", "token")
    pod, operator = _pod(manifests, "operator")
    assert "GITHUB_MCP_TOKEN" not in secret_refs(pod, operator)  # it calls no server


def test_a_config_change_rolls_the_workers(render: Render, tmp_path: Path) -> None:
    values = tmp_path / "mcp.yaml"
    values.write_text(yaml.safe_dump(VALUES))
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump({"mcp": {**VALUES["mcp"], "servers": VALUES["mcp"]["servers"][:1]}}))

    def checksum(path: Path) -> str:
        pod = find(render(path), "Deployment", "-worker")["spec"]["template"]
        return str(pod["metadata"]["annotations"]["checksum/config"])

    assert checksum(values) != checksum(changed)


def test_defaults_configure_no_mcp_server(render: Render) -> None:
    manifests = render()
    assert "AGENTRUN_MCP_SERVERS" not in find(manifests, "ConfigMap", "-config")["data"]
    assert not [m for m in manifests if m["kind"] == "ConfigMap" and m["metadata"]["name"].endswith("-mcp")]
    pod, _ = _pod(manifests, "worker")
    assert "mcp" not in {v["name"] for v in pod["volumes"]}


def test_the_operator_accepts_the_mcp_tools_the_allow_lists_name(tmp_path: Path) -> None:
    path = tmp_path / "servers.json"
    path.write_text(yaml.safe_dump({"servers": VALUES["mcp"]["servers"][:1]}))
    names = _with_mcp_tools(frozenset({"lookup"}), str(path))  # no GITHUB_MCP_TOKEN needed
    assert names == {"lookup", "github__search_issues", "github__create_issue"}
    path.write_text(yaml.safe_dump({"servers": VALUES["mcp"]["servers"]}))
    assert _with_mcp_tools(frozenset({"lookup"}), str(path)) is None  # `files` may offer any tool
    assert _with_mcp_tools(frozenset({"lookup"}), None) == {"lookup"}
