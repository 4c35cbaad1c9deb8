"""The providers file (AGENTRUN_PROVIDERS), model prefixes, and the submit check that names known providers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from agentrun.worker.api.app import create_app
from agentrun.worker.core.types import LlmError, LlmRequest
from agentrun.worker.llm.factory import LlmSettings, build_router, llm_from_env
from agentrun.worker.llm.providers import Endpoint, Model, Providers, split
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.testing.fake_openai_server import FakeOpenAi
from agentrun.worker.tools import ToolBox

FILE = """
providers:
  - name: vllm
    kind: openai
    baseUrl: http://vllm.models.svc:8000/v1/
    apiKeyEnv: VLLM_API_KEY
  - name: openai
    kind: openai
    baseUrl: https://api.openai.com/v1
    apiKeyEnv: OPENAI_API_KEY
    maxTokensParam: max_completion_tokens
    headers:
      OpenAI-Organization: org-123
"""


@pytest.mark.parametrize(("model", "provider", "id"), [
    ("claude-sonnet-4-6", "anthropic", "claude-sonnet-4-6"),
    ("anthropic/claude-sonnet-4-6", "anthropic", "claude-sonnet-4-6"),
    ("bedrock/us.anthropic.claude-sonnet-4-5-20250929-v1:0", "bedrock", "us.anthropic.claude-sonnet-4-5-20250929-v1:0"),
    ("vertex/claude-sonnet-4-5@20250929", "vertex", "claude-sonnet-4-5@20250929"),
    ("vllm/meta-llama/Llama-3.1-8B-Instruct", "vllm", "meta-llama/Llama-3.1-8B-Instruct"),
])
def test_the_prefix_picks_the_provider(model: str, provider: str, id: str) -> None:
    assert split(model) == Model(provider, id)


def test_a_file_declares_endpoints_side_by_side() -> None:
    providers = Providers.parse(FILE)
    assert providers.names == ("anthropic", "bedrock", "vertex", "vllm", "openai")
    assert providers.endpoints["vllm"] == Endpoint("vllm", "http://vllm.models.svc:8000/v1", "VLLM_API_KEY")
    assert providers.endpoints["openai"].headers == {"OpenAI-Organization": "org-123"}
    assert providers.endpoints["openai"].max_tokens_param == "max_completion_tokens"


def test_json_works_too_and_an_empty_file_declares_nothing(tmp_path: Path) -> None:
    path = tmp_path / "providers.json"
    path.write_text('{"providers": [{"name": "ollama", "kind": "openai", "baseUrl": "http://ollama:11434/v1"}]}')
    assert Providers.load(path).endpoints["ollama"].api_key_env is None
    assert Providers.parse("").names == ("anthropic", "bedrock", "vertex")
    assert Providers.load(None) == Providers()


@pytest.mark.parametrize(("text", "message"), [
    ("providers: {name: x}", "providers: must be a list"),
    ("endpoints: []", "one key, `providers`"),
    ("providers: [{kind: openai, baseUrl: 'http://x'}]", "providers[0].name: is required"),
    ("providers: [{name: Big, kind: openai, baseUrl: 'http://x'}]", "providers[0].name: 'Big' must be lowercase"),
    ("providers: [{name: bedrock, kind: openai, baseUrl: 'http://x'}]", "'bedrock' is a built-in provider"),
    ("providers: [{name: a, kind: openai, baseUrl: 'http://x'}, {name: a, kind: openai, baseUrl: 'http://y'}]",
     "providers[1].name: 'a' is declared twice"),
    ("providers: [{name: a, kind: gemini, baseUrl: 'http://x'}]", "providers[0].kind: 'gemini' is not a provider kind"),
    ("providers: [{name: a, kind: openai, baseUrl: 'vllm:8000'}]", "providers[0].baseUrl: 'vllm:8000' must be an http"),
    ("providers: [{name: a, kind: openai, baseUrl: 'http://x', apiKeyEnv: 'my key'}]", "not an environment variable"),
    ("providers: [{name: a, kind: openai, baseUrl: 'http://x', headers: {X-A: 1}}]", "providers[0].headers"),
    ("providers: [{name: a, kind: openai, baseUrl: 'http://x', apikeyenv: K}]", "unknown field 'apikeyenv'"),
    ("providers: [{name: a, kind: openai, baseUrl: 'http://x', maxTokensParam: n}]", "maxTokensParam: must be one of"),
    ("providers: [oops", "neither YAML nor JSON"),
    ('{"providers": [', "neither YAML nor JSON"),
])
def test_a_bad_file_is_refused_naming_the_entry_and_field(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        Providers.parse(text)
    assert message in str(caught.value)


@pytest.mark.parametrize(("model", "message"), [
    ("gemini/gemini-2.5-pro", "unknown model provider 'gemini' in 'gemini/gemini-2.5-pro'; known providers: "
                              "anthropic, bedrock, vertex, vllm, openai"),
    ("vllm/", "names no model after the provider prefix vllm/"),
])
def test_a_model_no_provider_serves_is_a_problem(model: str, message: str) -> None:
    assert message in (Providers.parse(FILE).problem(model) or "")


def test_known_models_are_no_problem() -> None:
    providers = Providers.parse(FILE)
    for model in ("claude-haiku-4-5", "anthropic/claude-haiku-4-5", "bedrock/x", "vertex/y", "vllm/z", "openai/gpt-4.1"):
        assert providers.problem(model) is None


# -- the worker's start --------------------------------------------------------------------------------


def test_a_bad_providers_file_exits_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text("providers: [{name: a, kind: openai}]")
    settings = WorkerSettings(database_url="unused", providers_file=str(path))
    with pytest.raises(SystemExit) as caught:
        llm_from_env(settings, {"ANTHROPIC_API_KEY": "k"})
    assert "AGENTRUN_PROVIDERS" in str(caught.value.code) and "providers[0].baseUrl: is required" in str(caught.value.code)


def test_an_unknown_default_model_provider_exits_naming_the_known_ones() -> None:
    settings = WorkerSettings(database_url="unused", default_model="gemini/gemini-2.5-pro")
    with pytest.raises(SystemExit) as caught:
        llm_from_env(settings, {"ANTHROPIC_API_KEY": "k"})
    assert "AGENTRUN_DEFAULT_MODEL" in str(caught.value.code) and "anthropic, bedrock, vertex" in str(caught.value.code)


def test_an_endpoint_default_model_without_its_key_exits_naming_the_variable(tmp_path: Path) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(FILE)
    settings = WorkerSettings(database_url="unused", providers_file=str(path), default_model="vllm/qwen3-8b")
    with pytest.raises(SystemExit) as caught:
        llm_from_env(settings, {})
    assert "VLLM_API_KEY is not set" in str(caught.value.code)


def test_a_worker_for_other_providers_needs_no_anthropic_key(tmp_path: Path) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(FILE)
    settings = WorkerSettings(database_url="unused", providers_file=str(path), default_model="vllm/qwen3-8b")
    llm_from_env(settings, {"VLLM_API_KEY": "k"})  # no ANTHROPIC_API_KEY, no exit


async def test_an_anthropic_model_without_an_anthropic_api_fails_saying_what_to_set() -> None:
    router = build_router(LlmSettings(), environ={})
    try:
        with pytest.raises(LlmError) as caught:
            await router.send(LlmRequest("claude-sonnet-4-6", 64, [{"role": "user", "content": "hi"}]))
    finally:
        await router.aclose()
    assert not caught.value.retryable
    assert "ANTHROPIC_API_KEY" in str(caught.value) and "ANTHROPIC_BASE_URL" in str(caught.value)


async def test_each_endpoint_is_reached_with_its_own_key(monkeypatch: pytest.MonkeyPatch) -> None:
    async with FakeOpenAi() as one, FakeOpenAi() as two:
        providers = Providers.parse(f"""
providers:
  - {{name: one, kind: openai, baseUrl: "{one.v1_url}", apiKeyEnv: ONE_KEY}}
  - {{name: two, kind: openai, baseUrl: "{two.v1_url}"}}
""")
        router = build_router(LlmSettings(), providers=providers, environ={"ONE_KEY": "sk-one"})
        try:
            await router.send(LlmRequest("one/m1", 64, [{"role": "user", "content": "hi"}]))
            await router.send(LlmRequest("two/m2", 64, [{"role": "user", "content": "hi"}]))
        finally:
            await router.aclose()
        assert [b["model"] for b in one.requests] == ["m1"] and [b["model"] for b in two.requests] == ["m2"]
        assert one.received[0].headers["Authorization"] == "Bearer sk-one"
        assert two.received[0].headers["Authorization"] == "Bearer unused"


# -- submit --------------------------------------------------------------------------------------------


@pytest.fixture
async def api(store: RunStore) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(store, ToolBox(), WorkerSettings(database_url="unused"), Metrics(), providers=Providers.parse(FILE))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://agentrun.test") as client:
        yield client


RUN = {"input": "What is open?", "tokenBudget": 1000, "timeoutSeconds": 60}


async def test_submit_refuses_an_unknown_prefix_with_a_422_naming_the_known_providers(api: httpx.AsyncClient) -> None:
    r = await api.post("/api/runs", json={**RUN, "model": "gemini/gemini-2.5-pro"})

    assert r.status_code == 422
    body = r.json()
    assert "unknown model provider 'gemini'" in body["error"]
    assert body["fields"][0]["field"] == "model"
    assert "known providers: anthropic, bedrock, vertex, vllm, openai" in body["fields"][0]["problem"]
    assert (await api.get("/api/runs")).json()["items"] == []  # nothing was queued


@pytest.mark.parametrize("model", ["claude-sonnet-4-6", "anthropic/claude-sonnet-4-6", "bedrock/anthropic.claude-sonnet-4-6",
                                   "vertex/claude-sonnet-4-6", "vllm/meta-llama/Llama-3.1-8B-Instruct"])
async def test_submit_accepts_every_known_provider(api: httpx.AsyncClient, model: str) -> None:
    r = await api.post("/api/runs", json={**RUN, "model": model})
    assert r.status_code == 201, r.text
    assert (await api.get(r.headers["location"])).json()["model"] == model


def test_a_declared_endpoint_without_its_key_is_warned_about_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(FILE)
    settings = WorkerSettings(database_url="unused", providers_file=str(path))
    llm_from_env(settings, {"ANTHROPIC_API_KEY": "k", "VLLM_API_KEY": "k"})
    assert "model provider openai is unusable until fixed" in caplog.text and "OPENAI_API_KEY" in caplog.text


def test_provider_credentials_are_redacted_from_logs(tmp_path: Path) -> None:
    from agentrun.worker.llm.providers import key_variables
    from agentrun.worker.obs import logs

    path = tmp_path / "providers.yaml"
    path.write_text(FILE)
    env = {"OPENAI_API_KEY": "sk-openai-secret", "VLLM_API_KEY": "vllm-secret", "AWS_SECRET_ACCESS_KEY": "aws-secret",
           "AWS_SESSION_TOKEN": "aws-session", "AWS_BEARER_TOKEN_BEDROCK": "bedrock-key", "ANTHROPIC_API_KEY": "sk-ant-x"}
    assert key_variables(str(path)) == ("VLLM_API_KEY", "OPENAI_API_KEY")
    assert key_variables(str(tmp_path / "absent.yaml")) == ()
    redact = logs.Redactor(logs.secrets_from_env(env, names=key_variables(str(path))))
    line = redact(" ".join(env.values()))
    assert not any(secret in line for secret in env.values()), line
