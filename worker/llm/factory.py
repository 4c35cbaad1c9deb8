"""Builds the model client a worker uses, `Retrying(TimeLimited(ProviderRouter))`, from the environment."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from agentrun.worker.core.types import HTTP_CLIENTS, HttpClient, LlmClient
from agentrun.worker.llm.cloud import ProviderUnavailable
from agentrun.worker.llm.limits import Limited, Limiter
from agentrun.worker.llm.providers import ANTHROPIC, BEDROCK, VERTEX, Endpoint, Providers, split
from agentrun.worker.llm.retry import Retrying
from agentrun.worker.llm.router import Factory, ProviderRouter
from agentrun.worker.llm.timeout import TimeLimited

if TYPE_CHECKING:
    # The SDKs (anthropic, openai, boto3, google-auth) are imported when their provider is built, so a
    # bad setting, --help and an API-only process (--concurrency 0) never import them.
    from agentrun.worker.llm.anthropic_client import AnthropicClient
    from agentrun.worker.settings import WorkerSettings

log = logging.getLogger(__name__)

NO_MODEL_API = (
    "agentrun: no model API configured: set ANTHROPIC_API_KEY for api.anthropic.com, or ANTHROPIC_BASE_URL "
    "for another Messages API endpoint (a proxy, or a local fake: "
    "`python -m agentrun.worker.testing.fake_server --port 8088` and ANTHROPIC_BASE_URL=http://127.0.0.1:8088)"
)


@dataclasses.dataclass(frozen=True)
class LlmSettings:
    """How the worker calls the model; `from_env` reads each field from the variable named below."""

    max_attempts: int = 5
    """Calls per model step, the first included (AGENTRUN_LLM_MAX_ATTEMPTS). With the default backoff,
    five attempts ride out about a minute of overload before the run fails."""

    timeout_seconds: float = 120.0
    """Limit of ONE attempt (AGENTRUN_LLM_TIMEOUT_SECONDS). A non-streaming answer of 4096 tokens takes
    about a minute; twice that is left before an attempt counts as hung and is retried. The lease
    heartbeat covers the whole step, so this can exceed the lease."""

    backoff_base_seconds: float = 1.0
    """First backoff ceiling; it doubles per attempt (AGENTRUN_LLM_BACKOFF_BASE_SECONDS)."""

    backoff_cap_seconds: float = 30.0
    """Largest backoff ceiling (AGENTRUN_LLM_BACKOFF_CAP_SECONDS). A `retry-after` from the API may ask
    for longer, and is honoured."""

    http_margin_seconds: float = 5.0
    """The SDK's own HTTP timeout sits this far above `timeout_seconds`, so the limit that fires is ours."""

    http_client: HttpClient = "aiohttp"
    """The Anthropic SDK's transport (AGENTRUN_LLM_HTTP_CLIENT): "aiohttp", the SDK's `DefaultAioHttpClient`,
    costs about half the CPU per call of "httpx", its default (bench/README.md, B9); "httpx" is there
    for a network where aiohttp misbehaves."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> LlmSettings:
        """Fields from AGENTRUN_LLM_* variables; ValueError naming the variable if one is bad."""

        def read(var: str, kind: Callable[[str], float], default: float, minimum: float) -> float:
            text = environ.get(var, "").strip()
            if not text:
                return default
            try:
                value = kind(text)
            except ValueError:
                what = "a whole number" if kind is int else "a number"
                raise ValueError(f"{var} must be {what}, got {text!r}") from None
            if not value >= minimum:
                raise ValueError(f"{var} must be at least {minimum:g}, got {text!r}")
            return value

        d = cls()
        http_client = environ.get("AGENTRUN_LLM_HTTP_CLIENT", "").strip().lower() or d.http_client
        if http_client not in HTTP_CLIENTS:
            raise ValueError(
                f"AGENTRUN_LLM_HTTP_CLIENT must be one of {', '.join(HTTP_CLIENTS)}, got {http_client!r}"
            )
        return cls(
            max_attempts=int(read("AGENTRUN_LLM_MAX_ATTEMPTS", int, d.max_attempts, 1)),
            timeout_seconds=read("AGENTRUN_LLM_TIMEOUT_SECONDS", float, d.timeout_seconds, 0.001),
            backoff_base_seconds=read("AGENTRUN_LLM_BACKOFF_BASE_SECONDS", float, d.backoff_base_seconds, 0),
            backoff_cap_seconds=read("AGENTRUN_LLM_BACKOFF_CAP_SECONDS", float, d.backoff_cap_seconds, 0),
            http_client=http_client,
        )


def build_llm(
    llm: LlmSettings,
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    on_retry: Callable[[int], None] | None = None,
    providers: Providers | None = None,
    environ: Mapping[str, str] | None = None,
    limiter: Limiter | None = None,
) -> Retrying:
    """`Retrying(TimeLimited(ProviderRouter))`: the retry loop outside, the attempt limit inside it, and
    inside that the client of the model's provider, so every provider gets the same policy and metrics;
    with a `limiter`, each attempt first waits for the fleet-wide limit (`Limited`).

    Without `api_key` and `base_url`, an Anthropic model fails its run saying what to set.
    """
    return decorated(llm, build_router(llm, api_key=api_key, base_url=base_url, providers=providers, environ=environ),
                     on_retry, limiter)


def decorated(
    llm: LlmSettings, client: LlmClient, on_retry: Callable[[int], None] | None = None, limiter: Limiter | None = None
) -> Retrying:
    """`client` with the shared retry policy and per-attempt time limit of `llm`; with a `limiter`,
    `Retrying(Limited(TimeLimited(...)))`: each attempt waits for the fleet-wide limit, and the wait is not
    counted as the attempt's time."""
    attempt: LlmClient = TimeLimited(client, llm.timeout_seconds)
    if limiter is not None:
        attempt = Limited(attempt, limiter)
    return Retrying(
        attempt,
        max_attempts=llm.max_attempts,
        base=llm.backoff_base_seconds,
        cap=llm.backoff_cap_seconds,
        on_retry=on_retry,
    )


def build_router(
    llm: LlmSettings,
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    providers: Providers | None = None,
    environ: Mapping[str, str] | None = None,
) -> ProviderRouter:
    """The router over the built-in providers and the declared endpoints, each built on first use."""
    env = os.environ if environ is None else environ
    http_timeout = llm.timeout_seconds + llm.http_margin_seconds

    def anthropic_api() -> AnthropicClient:
        if api_key is None and base_url is None:
            raise ProviderUnavailable(NO_MODEL_API)
        from agentrun.worker.llm.anthropic_client import AnthropicClient

        return AnthropicClient(
            api_key=api_key, base_url=base_url, http_timeout=http_timeout, http_client=llm.http_client
        )

    def bedrock() -> LlmClient:
        from agentrun.worker.llm.bedrock import bedrock_client

        return bedrock_client(env, http_timeout)

    def vertex() -> LlmClient:
        from agentrun.worker.llm.vertex import vertex_client

        return vertex_client(env, http_timeout)

    factories: dict[str, Factory] = {ANTHROPIC: anthropic_api, BEDROCK: bedrock, VERTEX: vertex}
    for endpoint in (providers or Providers()).endpoints.values():
        factories[endpoint.name] = _openai_factory(endpoint, env, http_timeout)
    return ProviderRouter(factories)


def _openai_factory(endpoint: Endpoint, env: Mapping[str, str], http_timeout: float) -> Factory:
    def build() -> LlmClient:
        try:
            from agentrun.worker.llm.openai_client import OpenAiClient
        except ImportError:
            raise ProviderUnavailable(
                f"provider {endpoint.name!r} (kind openai) needs the openai package: pip install 'agentrun[openai]'"
            ) from None
        key = None
        if endpoint.api_key_env is not None:
            key = env.get(endpoint.api_key_env) or None
            if key is None:
                raise ProviderUnavailable(
                    f"provider {endpoint.name!r}: its API key variable {endpoint.api_key_env} is not set"
                )
        return OpenAiClient(
            base_url=endpoint.base_url, api_key=key, headers=endpoint.headers,
            max_tokens_param=endpoint.max_tokens_param, http_timeout=http_timeout,
        )

    return build


def load_providers(path: str | None) -> Providers:
    """The AGENTRUN_PROVIDERS file, or an exit naming what is wrong with it."""
    try:
        return Providers.load(path)
    except (OSError, ValueError) as e:
        raise SystemExit(f"agentrun: cannot read the providers file (AGENTRUN_PROVIDERS={path}): {e}") from None


def llm_from_env(
    settings: WorkerSettings,
    environ: Mapping[str, str] | None = None,
    on_retry: Callable[[int], None] | None = None,
    providers: Providers | None = None,
    limiter: Limiter | None = None,
) -> LlmClient:
    """The worker's model client from ANTHROPIC_*, AGENTRUN_LLM_* and the providers' variables; exits with
    a clear message when a variable is bad, the providers file is, or the default model's provider
    cannot be built (an Anthropic default model needs ANTHROPIC_API_KEY or ANTHROPIC_BASE_URL)."""
    env = os.environ if environ is None else environ
    if providers is None:
        providers = load_providers(settings.providers_file)
    api_key = env.get("ANTHROPIC_API_KEY") or None
    base_url = env.get("ANTHROPIC_BASE_URL") or None
    if api_key is None and base_url is not None and not env.get("ANTHROPIC_AUTH_TOKEN"):
        # A local server or an authenticating proxy needs no key, but the SDK refuses to send without one.
        api_key = "unused"
    try:
        llm = LlmSettings.from_env(env)
    except ValueError as e:
        raise SystemExit(f"agentrun: {e}") from None
    if problem := providers.problem(settings.default_model):
        raise SystemExit(f"agentrun: AGENTRUN_DEFAULT_MODEL: {problem}")
    router = build_router(llm, api_key=api_key, base_url=base_url, providers=providers, environ=env)
    default = split(settings.default_model).provider
    try:
        # The default model's provider is built now, so a worker that cannot serve it says so at start.
        router.client(default)
    except ProviderUnavailable as e:
        raise SystemExit(str(e) if str(e).startswith("agentrun:") else f"agentrun: {e}") from None
    for name in providers.endpoints:
        # Declared endpoints are cheap to build: a missing key variable is said now, not at the first run.
        try:
            router.client(name)
        except ProviderUnavailable as e:
            log.warning("model provider %s is unusable until fixed; its runs will fail: %s", name, e)
    log.info(
        "model providers %s (default %s; Anthropic API at %s): %d attempts of at most %gs each",
        ", ".join(providers.names), default, base_url or "https://api.anthropic.com",
        llm.max_attempts, llm.timeout_seconds,
    )
    return decorated(llm, router, on_retry, limiter)
