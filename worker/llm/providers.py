"""Which provider serves a model: the name's prefix, and the OpenAI-compatible endpoints of AGENTRUN_PROVIDERS.

Pure configuration, no SDK: the API checks a submitted model against it, the router picks a client by it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ANTHROPIC = "anthropic"
BEDROCK = "bedrock"
VERTEX = "vertex"
BUILTIN = (ANTHROPIC, BEDROCK, VERTEX)
"""Providers every worker knows. A model without a prefix is an Anthropic API model."""

KINDS = ("openai",)
NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")
ENV_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an RFC 9110 token
FIELDS = {"name", "kind", "baseUrl", "apiKeyEnv", "headers", "maxTokensParam"}
MAX_TOKENS_PARAMS = ("max_tokens", "max_completion_tokens")


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible Chat Completions endpoint declared in the providers file."""

    name: str
    """The model prefix that selects it: `<name>/<model>`."""

    base_url: str
    """Up to and including the API version, e.g. http://vllm:8000/v1 (the SDK appends /chat/completions)."""

    api_key_env: str | None = None
    """The variable holding its API key; None for endpoints that need none (a local vLLM or Ollama)."""

    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Sent with every request (a tenant or routing header of a gateway such as LiteLLM)."""

    max_tokens_param: str = "max_tokens"
    """How the request names its output limit. `max_tokens` is what every compatible server reads;
    OpenAI's own reasoning models accept only `max_completion_tokens`."""

    kind: str = "openai"


@dataclasses.dataclass(frozen=True)
class Model:
    """A model name split into its provider and the id that provider knows it by."""

    provider: str
    id: str


def split(model: str) -> Model:
    """`bedrock/anthropic.claude-sonnet-4-6` → (bedrock, anthropic.claude-sonnet-4-6); no prefix → anthropic.

    Only the first `/` separates: the rest is the provider's own id, which may contain more of them
    (`vllm/meta-llama/Llama-3.1-8B-Instruct`).
    """
    provider, sep, rest = model.partition("/")
    return Model(provider, rest) if sep else Model(ANTHROPIC, model)


@dataclasses.dataclass(frozen=True)
class Providers:
    """The built-in providers and the declared endpoints, by name."""

    endpoints: Mapping[str, Endpoint] = dataclasses.field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return (*BUILTIN, *self.endpoints)

    def problem(self, model: str) -> str | None:
        """Why `model` cannot be served, naming the known providers; None if some provider serves it."""
        m = split(model)
        if m.provider not in self.names:
            return (f"unknown model provider {m.provider!r} in {model!r}; known providers: "
                    f"{', '.join(self.names)} (a model without a prefix is an Anthropic API model)")
        if not m.id.strip():
            return f"model {model!r} names no model after the provider prefix {m.provider}/"
        return None

    @classmethod
    def load(cls, path: str | Path | None) -> Providers:
        """The endpoints of the file at `path` (AGENTRUN_PROVIDERS), none without one.

        OSError if it cannot be read, ValueError naming the entry and field if it is malformed.
        """
        if not path:
            return cls()
        return cls.parse(Path(path).read_text(encoding="utf-8"))

    @classmethod
    def parse(cls, text: str) -> Providers:
        """`providers: [...]` from YAML or JSON (JSON is YAML, but its own parser gives better messages)."""
        try:
            data: Any = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as e:
            raise ValueError(f"providers file is neither YAML nor JSON: {e}") from None
        if data is None:
            return cls()
        if not isinstance(data, dict) or set(data) - {"providers"}:
            raise ValueError("providers file must be a mapping with one key, `providers`: a list of endpoints")
        entries = data.get("providers") or []
        if not isinstance(entries, list):
            raise ValueError("providers: must be a list of endpoints")
        endpoints: dict[str, Endpoint] = {}
        for i, entry in enumerate(entries):
            endpoint = _endpoint(f"providers[{i}]", entry)
            if endpoint.name in BUILTIN:
                raise ValueError(f"providers[{i}].name: {endpoint.name!r} is a built-in provider; choose another name")
            if endpoint.name in endpoints:
                raise ValueError(f"providers[{i}].name: {endpoint.name!r} is declared twice")
            endpoints[endpoint.name] = endpoint
        return cls(endpoints)


def _endpoint(where: str, entry: Any) -> Endpoint:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: must be a mapping with name, kind and baseUrl")
    if unknown := sorted(set(map(str, entry)) - FIELDS):
        raise ValueError(f"{where}: unknown field {unknown[0]!r}; the fields are {', '.join(sorted(FIELDS))}")

    def text(field: str, required: bool = True) -> str | None:
        value = entry.get(field)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value.strip():
            required_and = "is required and " if value is None else ""
            raise ValueError(f"{where}.{field}: {required_and}must be a non-empty string")
        return value.strip()

    name = text("name") or ""
    if not NAME.fullmatch(name):
        raise ValueError(f"{where}.name: {name!r} must be lowercase letters, digits, '.', '_' or '-' (at most 63)")
    kind = text("kind") or ""
    if kind not in KINDS:
        raise ValueError(f"{where}.kind: {kind!r} is not a provider kind; known kinds: {', '.join(KINDS)}")
    base_url = text("baseUrl") or ""
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", base_url):
        raise ValueError(f"{where}.baseUrl: {base_url!r} must be an http:// or https:// URL")
    key_env = text("apiKeyEnv", required=False)
    if key_env is not None and not ENV_VAR.fullmatch(key_env):
        raise ValueError(f"{where}.apiKeyEnv: {key_env!r} is not an environment variable name")
    headers = entry.get("headers") or {}
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and HEADER.fullmatch(k) and isinstance(v, str) and "\n" not in v and "\r" not in v
        for k, v in headers.items()
    ):
        raise ValueError(f"{where}.headers: must map header names to single-line string values")
    param = text("maxTokensParam", required=False) or "max_tokens"
    if param not in MAX_TOKENS_PARAMS:
        raise ValueError(f"{where}.maxTokensParam: must be one of {', '.join(MAX_TOKENS_PARAMS)}, got {param!r}")
    return Endpoint(name, base_url.rstrip("/"), key_env, dict(headers), param, kind)


def key_variables(path: str | None) -> tuple[str, ...]:
    """The API key variables the providers file at `path` names, for log redaction at start; none if it
    cannot be read (the worker reports that itself, once logging is set up)."""
    try:
        return tuple(e.api_key_env for e in Providers.load(path).endpoints.values() if e.api_key_env)
    except (OSError, ValueError):
        return ()
