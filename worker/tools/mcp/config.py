"""The MCP servers a worker offers tools of: AGENTRUN_MCP_SERVERS, a YAML or JSON file `servers: [...]`.

Pure apart from reading the file: header and env values take `${VAR}` from the environment given, so
secrets come from Kubernetes Secrets and never sit in the file.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from agentrun.worker.tools.errors import McpConfigError

SERVER_NAME = re.compile(r"[a-zA-Z0-9-]+(_[a-zA-Z0-9-]+)*")
"""A server's name: the prefix of its tools' names, `<server>__<tool>`. No `__` in it and no `_` at its
ends, so the first `__` of a tool name is where the server's name ends: two servers never clash."""
MAX_SERVER_NAME = 32
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
DEFAULT_TIMEOUT = 30.0
DEFAULT_MAX_TIMEOUT = 600.0
"""How long progress notifications may keep a call going, unless the config says (`maxTimeoutSeconds`)."""


class Approval(enum.Enum):
    NONE = "none"
    DESTRUCTIVE = "destructive"  # tools not read-only whose destructiveHint is not false (the MCP default)
    ALL = "all"


@dataclasses.dataclass(frozen=True)
class Override:
    """What the config says of one tool, over its annotations."""

    idempotent: bool | None = None
    requires_approval: bool | None = None
    timeout_seconds: float | None = None
    reconcile: str | None = None
    max_timeout_seconds: float | None = None
    """A read-only tool of the same server asked about a call in doubt (checked when the server lists its
    tools): called with `{"idempotencyKey": ...}`, a text result is the call's result, an empty one or
    `{"done": false}` says it was not done, an error result that it cannot tell (client.py)."""


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    name: str
    url: str | None = None  # Streamable HTTP
    command: str | None = None  # stdio
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)  # may hold secrets
    tools: frozenset[str] | None = None  # the allow-list of the server's own tool names; None: all
    overrides: Mapping[str, Override] = dataclasses.field(default_factory=dict)
    require_approval: Approval = Approval.NONE
    timeout_seconds: float = DEFAULT_TIMEOUT
    """Per call, unless a tool's override says otherwise; a call silent past it is an is_error result.
    Each progress notification of the call starts it again, up to `max_timeout_seconds` in all."""
    max_timeout_seconds: float = DEFAULT_MAX_TIMEOUT

    @property
    def prefix(self) -> str:
        return f"{self.name}__"

    def allows(self, tool: str) -> bool:
        return self.tools is None or tool in self.tools


_SERVER_KEYS = {"name", "url", "command", "args", "env", "headers", "tools", "overrides", "requireApproval",
                "timeoutSeconds", "maxTimeoutSeconds"}
_OVERRIDE_KEYS = {"idempotent", "requiresApproval", "timeoutSeconds", "maxTimeoutSeconds", "reconcile"}


def load_servers(path: str | None, environ: Mapping[str, str]) -> list[ServerConfig]:
    """The servers of the file at `path` (none when `path` is None). McpConfigError says what is wrong."""
    if not path:
        return []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise McpConfigError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise McpConfigError(f"{path} is not YAML or JSON: {' '.join(str(e).split())}") from None
    return parse_servers(doc, environ, where=path)


def parse_servers(doc: Any, environ: Mapping[str, str], where: str = "the MCP servers file") -> list[ServerConfig]:
    if not isinstance(doc, dict) or set(doc) - {"servers"} or not isinstance(doc.get("servers"), list):
        raise McpConfigError(f"{where}: must be a mapping with one key, `servers`, a list of servers")
    servers: list[ServerConfig] = []
    seen: set[str] = set()
    for i, raw in enumerate(doc["servers"]):
        server = _server(raw, environ, f"{where}: servers[{i}]")
        if server.name in seen:
            raise McpConfigError(f"{where}: servers[{i}]: a second server is named {server.name!r}")
        seen.add(server.name)
        servers.append(server)
    return servers


def _server(raw: Any, environ: Mapping[str, str], at: str) -> ServerConfig:
    if not isinstance(raw, dict):
        raise McpConfigError(f"{at}: must be a mapping")
    if unknown := sorted(set(map(str, raw)) - _SERVER_KEYS):
        raise McpConfigError(f"{at}: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(_SERVER_KEYS))})")
    name = raw.get("name")
    if not isinstance(name, str) or len(name) > MAX_SERVER_NAME or not SERVER_NAME.fullmatch(name):
        raise McpConfigError(f"{at}: name must be 1 to {MAX_SERVER_NAME} letters, digits, `-` and single `_` "
                             f"(not at either end), got {name!r}")
    at = f"{at} ({name})"
    url, command = raw.get("url"), raw.get("command")
    if (url is None) == (command is None):
        raise McpConfigError(f"{at}: give either `url` (Streamable HTTP) or `command` (stdio)")
    if url is not None and (not isinstance(url, str) or not re.match(r"https?://[^/\s]+", url)):
        raise McpConfigError(f"{at}: url must be an http:// or https:// URL, got {url!r}")
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise McpConfigError(f"{at}: command must be a non-empty string")
    args = raw.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str | int | float) for a in args):
        raise McpConfigError(f"{at}: args must be a list of strings")
    if args and command is None:
        raise McpConfigError(f"{at}: args go with `command` (stdio), not with `url`")
    headers = _strings(raw.get("headers", {}), f"{at}: headers", environ)
    env = _strings(raw.get("env", {}), f"{at}: env", environ)
    if headers and url is None:
        raise McpConfigError(f"{at}: headers go with `url` (Streamable HTTP); a stdio server takes `env`")
    tools = raw.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, str) and t for t in tools)):
        raise McpConfigError(f"{at}: tools must be a list of the server's tool names")
    approval = raw.get("requireApproval", "none")
    try:
        require = Approval(approval)
    except ValueError:
        raise McpConfigError(f"{at}: requireApproval must be none, destructive or all, got {approval!r}") from None
    overrides_raw = raw.get("overrides", {})
    if not isinstance(overrides_raw, dict):
        raise McpConfigError(f"{at}: overrides must map tool names to {{idempotent, requiresApproval, "
                             "timeoutSeconds, maxTimeoutSeconds, reconcile}")
    overrides = {str(k): _override(v, f"{at}: overrides.{k}", str(k)) for k, v in overrides_raw.items()}
    timeout = _timeout(raw.get("timeoutSeconds", DEFAULT_TIMEOUT), f"{at}: timeoutSeconds")
    maximum = _timeout(raw.get("maxTimeoutSeconds", max(DEFAULT_MAX_TIMEOUT, timeout)), f"{at}: maxTimeoutSeconds")
    if maximum < timeout:
        raise McpConfigError(f"{at}: maxTimeoutSeconds ({maximum:g}) must be at least timeoutSeconds ({timeout:g})")
    return ServerConfig(
        name=name, url=url, command=command, args=tuple(str(a) for a in args), env=env, headers=headers,
        tools=frozenset(tools) if tools is not None else None, overrides=overrides, require_approval=require,
        timeout_seconds=timeout, max_timeout_seconds=maximum,
    )


def _override(raw: Any, at: str, tool: str) -> Override:
    if not isinstance(raw, dict):
        raise McpConfigError(f"{at}: must be a mapping of idempotent, requiresApproval, timeoutSeconds, "
                             "maxTimeoutSeconds, reconcile")
    if unknown := sorted(set(map(str, raw)) - _OVERRIDE_KEYS):
        raise McpConfigError(f"{at}: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(_OVERRIDE_KEYS))})")
    for key in ("idempotent", "requiresApproval"):
        if key in raw and not isinstance(raw[key], bool):
            raise McpConfigError(f"{at}.{key}: must be true or false, got {raw[key]!r}")
    timeout = raw.get("timeoutSeconds")
    reconcile = raw.get("reconcile")
    if reconcile is not None and (not isinstance(reconcile, str) or not reconcile):
        raise McpConfigError(f"{at}.reconcile: must name a read-only tool of the same server, got {reconcile!r}")
    if reconcile == tool:
        raise McpConfigError(f"{at}.reconcile: a tool cannot reconcile its own calls: name a read-only tool that "
                             "looks the call up by its idempotency key")
    timeout = _timeout(timeout, f"{at}.timeoutSeconds") if timeout is not None else None
    maximum = raw.get("maxTimeoutSeconds")
    maximum = _timeout(maximum, f"{at}.maxTimeoutSeconds") if maximum is not None else None
    if timeout is not None and maximum is not None and maximum < timeout:
        raise McpConfigError(f"{at}.maxTimeoutSeconds ({maximum:g}) must be at least its timeoutSeconds ({timeout:g})")
    return Override(raw.get("idempotent"), raw.get("requiresApproval"), timeout, reconcile, maximum)


def _timeout(value: Any, at: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise McpConfigError(f"{at}: must be a positive number of seconds, got {value!r}")
    return float(value)


def _strings(raw: Any, at: str, environ: Mapping[str, str]) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(isinstance(v, str | int | float) for v in raw.values()):
        raise McpConfigError(f"{at}: must map names to strings")
    return {str(k): expand(str(v), environ, f"{at}.{k}") for k, v in raw.items()}


def expand(value: str, environ: Mapping[str, str], at: str) -> str:
    """`${VAR}` replaced with the variable's value; a variable that is not set is an error, not ""."""
    missing = [m.group(1) for m in _VAR.finditer(value) if m.group(1) not in environ]
    if missing:
        raise McpConfigError(f"{at}: environment variable {missing[0]} is not set")
    return _VAR.sub(lambda m: environ[m.group(1)], value)


def secret_variables(path: str | None) -> list[str]:
    """The variables the file's `headers` and `env` values name (`${VAR}`), for the log redaction filter:
    their values are secrets. Best effort: a file that cannot be read names none (start-up says why)."""
    if not path:
        return []
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return []
    servers = doc.get("servers") if isinstance(doc, dict) else None
    found: list[str] = []
    for server in servers if isinstance(servers, list) else []:
        for key in ("headers", "env"):
            values = server.get(key) if isinstance(server, dict) else None
            if isinstance(values, dict):
                found.extend(m.group(1) for v in values.values() if isinstance(v, str) for m in _VAR.finditer(v))
    return found
