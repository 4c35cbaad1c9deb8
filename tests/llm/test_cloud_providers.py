"""Bedrock and Vertex through the Anthropic SDK's own clients against the local Messages API server, with
dummy credentials: the request each sends (path, signature, body) and its errors as `LlmError`s."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from agentrun.worker.core.types import LlmError, LlmRequest
from agentrun.worker.llm.bedrock import bedrock_client
from agentrun.worker.llm.cloud import Credentialed, ProviderUnavailable
from agentrun.worker.llm.factory import LlmSettings, build_router
from agentrun.worker.llm.router import ProviderRouter
from agentrun.worker.llm.vertex import vertex_client
from agentrun.worker.testing.fake_server import FakeAnthropic, Reply
from tests.support.llm import TOOLS

EPHEMERAL = {"type": "ephemeral"}
REQUEST = LlmRequest("claude-sonnet-4-6", 128, [{"role": "user", "content": "What is open?"}],
                     system="You triage tickets.", tools=TOOLS)
AWS_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION",
           "AWS_DEFAULT_REGION", "AWS_BEARER_TOKEN_BEDROCK", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE",
           "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI")


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """An AWS environment of dummy keys only: no config files, no instance metadata."""
    for var in AWS_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "dummy-secret")
    return monkeypatch


@pytest.fixture
async def bedrock(fake: FakeAnthropic, aws: pytest.MonkeyPatch) -> AsyncIterator[Credentialed]:
    client = bedrock_client({"AWS_REGION": "eu-west-1", "ANTHROPIC_BEDROCK_BASE_URL": fake.base_url}, 10.0)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def closing() -> AsyncIterator[list[Credentialed | ProviderRouter]]:
    """Clients made in a test, closed after it (their connection pools belong to its event loop)."""
    clients: list[Credentialed | ProviderRouter] = []
    yield clients
    for c in clients:
        await c.aclose()


async def test_bedrock_sends_a_signed_invoke_with_the_model_in_the_path(fake: FakeAnthropic, bedrock: Credentialed) -> None:
    fake.script(Reply.tool_use("list_tickets", {"status": "open"}, id="toolu_1"))

    response = await bedrock.send(
        LlmRequest("anthropic.claude-sonnet-4-5-20250929-v1:0", 128, REQUEST.messages, REQUEST.system, REQUEST.tools)
    )

    assert response.stop_reason == "tool_use" and response.content[0]["id"] == "toolu_1"
    got = fake.received[0]
    assert got.path == "/model/anthropic.claude-sonnet-4-5-20250929-v1:0/invoke"
    auth = got.headers["Authorization"]
    assert auth.startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/") and "/eu-west-1/bedrock/aws4_request" in auth
    assert "X-Amz-Date" in got.headers
    body = got.body
    assert body is not None and "model" not in body and body["anthropic_version"]
    # Bedrock supports prompt caching for Claude: the marks are sent as to the Anthropic API.
    assert body["system"] == [{"type": "text", "text": "You triage tickets.", "cache_control": EPHEMERAL}]
    assert body["messages"][-1]["content"][-1]["cache_control"] == EPHEMERAL


@pytest.mark.parametrize(("status", "error_type", "retryable"), [
    (429, "ThrottlingException", True),
    (503, "ServiceUnavailableException", True),
    (500, "InternalServerException", True),
    (400, "ValidationException", False),
    (403, "AccessDeniedException", False),
])
async def test_bedrock_errors_keep_the_shared_classes(
    fake: FakeAnthropic, bedrock: Credentialed, status: int, error_type: str, retryable: bool
) -> None:
    headers = {"x-amzn-ErrorType": f"{error_type}:http://internal.amazon.com/coral/com.amazon.bedrock/"}
    if status == 429:
        headers["retry-after"] = "3"
    fake.script(Reply(status=status, body={"message": f"{error_type}: the service says no"}, headers=headers))

    with pytest.raises(LlmError) as caught:
        await bedrock.send(REQUEST)

    assert (caught.value.status, caught.value.retryable) == (status, retryable)
    assert "the service says no" in caught.value.message
    assert caught.value.retry_after == (3.0 if status == 429 else None)


async def test_bedrock_without_credentials_fails_unretried_saying_so(
    fake: FakeAnthropic, aws: pytest.MonkeyPatch, closing: list[Credentialed | ProviderRouter]
) -> None:
    aws.delenv("AWS_ACCESS_KEY_ID")
    aws.delenv("AWS_SECRET_ACCESS_KEY")
    # A region no other test uses: the SDK caches one boto3 session (and its credentials) per region.
    client = bedrock_client({"AWS_REGION": "ap-south-1", "ANTHROPIC_BEDROCK_BASE_URL": fake.base_url}, 10.0)
    closing.append(client)

    with pytest.raises(LlmError) as caught:
        await client.send(REQUEST)

    assert caught.value.status == 401 and not caught.value.retryable
    assert caught.value.message.startswith("bedrock: credentials:") and "AWS credentials" in caught.value.message
    assert fake.requests == []


async def test_bedrock_with_an_api_key_sends_it_as_a_bearer_token(
    fake: FakeAnthropic, aws: pytest.MonkeyPatch, closing: list[Credentialed | ProviderRouter]
) -> None:
    aws.delenv("AWS_ACCESS_KEY_ID")
    aws.delenv("AWS_SECRET_ACCESS_KEY")
    client = bedrock_client({"AWS_REGION": "us-east-1", "ANTHROPIC_BEDROCK_BASE_URL": fake.base_url,
                             "AWS_BEARER_TOKEN_BEDROCK": "bedrock-api-key"}, 10.0)
    closing.append(client)
    await client.send(REQUEST)
    assert fake.received[0].headers["Authorization"] == "Bearer bedrock-api-key"


def test_bedrock_without_a_region_is_unavailable_naming_it(aws: pytest.MonkeyPatch) -> None:
    with pytest.raises(ProviderUnavailable) as caught:
        bedrock_client({}, 10.0)
    assert "bedrock" in str(caught.value) and "AWS_REGION" in str(caught.value)


# -- Vertex -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def private_key() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return pem.decode()


@pytest.fixture
def adc(fake: FakeAnthropic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_key: str) -> Path:
    """A dummy service account key file (the chart's key Secret), whose token exchange goes to the fake server."""
    path = tmp_path / "key.json"
    path.write_text(json.dumps({
        "type": "service_account", "project_id": "project-from-key", "private_key_id": "dummy-key-id",
        "private_key": private_key, "client_email": "agentrun@project-from-key.iam.gserviceaccount.com",
        "client_id": "1234567890", "token_uri": f"{fake.base_url}/token",
    }))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    monkeypatch.delenv("ANTHROPIC_VERTEX_PROJECT_ID", raising=False)
    return path


def vertex_env(fake: FakeAnthropic) -> dict[str, str]:
    return {"CLOUD_ML_REGION": "us-east5", "ANTHROPIC_VERTEX_PROJECT_ID": "agentrun-test",
            "ANTHROPIC_VERTEX_BASE_URL": f"{fake.base_url}/v1"}


async def test_vertex_sends_raw_predict_with_a_refreshed_token(
    fake: FakeAnthropic, adc: Path, closing: list[Credentialed | ProviderRouter]
) -> None:
    client = vertex_client(vertex_env(fake), 10.0)

    response = await client.send(REQUEST)
    await client.send(REQUEST)

    assert response.stop_reason == "tool_use"
    paths = [r.path for r in fake.received]
    predict = "/v1/projects/agentrun-test/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-6:rawPredict"
    assert paths == ["/token", predict, predict]  # one refresh, then the token is reused
    got = fake.received[1]
    assert got.headers["Authorization"] == "Bearer ya29.fake-token"
    assert got.body is not None and "model" not in got.body and got.body["anthropic_version"]
    assert got.body["system"][0]["cache_control"] == EPHEMERAL


async def test_vertex_takes_the_project_from_the_key_when_none_is_set(
    fake: FakeAnthropic, adc: Path, closing: list[Credentialed | ProviderRouter]
) -> None:
    env = {k: v for k, v in vertex_env(fake).items() if k != "ANTHROPIC_VERTEX_PROJECT_ID"}
    client = vertex_client(env, 10.0)
    closing.append(client)

    await client.send(REQUEST)

    assert fake.received[-1].path.startswith("/v1/projects/project-from-key/locations/us-east5/")


@pytest.mark.parametrize(("status", "retryable"), [(429, True), (529, True), (500, True), (400, False), (404, False)])
async def test_vertex_errors_keep_the_shared_classes(
    fake: FakeAnthropic, adc: Path, status: int, retryable: bool, closing: list[Credentialed | ProviderRouter]
) -> None:
    client = vertex_client(vertex_env(fake), 10.0)
    fake.script(Reply.error(status, f"vertex says {status}", retry_after=2 if status == 429 else None))
    closing.append(client)

    with pytest.raises(LlmError) as caught:
        await client.send(REQUEST)

    assert (caught.value.status, caught.value.retryable) == (status, retryable)
    assert f"vertex says {status}" in caught.value.message
    assert caught.value.retry_after == (2.0 if status == 429 else None)


async def test_vertex_with_a_missing_key_file_fails_unretried_saying_so(
    fake: FakeAnthropic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, closing: list[Credentialed | ProviderRouter]
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))
    client = vertex_client(vertex_env(fake), 10.0)

    with pytest.raises(LlmError) as caught:
        await client.send(REQUEST)

    assert caught.value.status == 401 and not caught.value.retryable
    assert caught.value.message.startswith("vertex: credentials:") and "absent.json" in caught.value.message
    assert fake.requests == []


def test_vertex_without_a_region_is_unavailable_naming_it() -> None:
    with pytest.raises(ProviderUnavailable) as caught:
        vertex_client({"ANTHROPIC_VERTEX_PROJECT_ID": "p"}, 10.0)
    assert "CLOUD_ML_REGION" in str(caught.value)


# -- through the router -------------------------------------------------------------------------------


async def test_the_router_strips_the_prefix_and_reaches_each_provider(
    fake: FakeAnthropic, aws: pytest.MonkeyPatch, adc: Path, closing: list[Credentialed | ProviderRouter]
) -> None:
    env = {"AWS_REGION": "eu-west-1", "ANTHROPIC_BEDROCK_BASE_URL": fake.base_url, **vertex_env(fake)}
    router = build_router(LlmSettings(), api_key="test-key", base_url=fake.base_url, environ=env)
    closing.append(router)

    for model in ("claude-sonnet-4-6", "anthropic/claude-sonnet-4-6", "bedrock/anthropic.claude-sonnet-4-6",
                  "vertex/claude-sonnet-4-6"):
        await router.send(LlmRequest(model, 64, [{"role": "user", "content": "hi"}]))

    paths = [r.path for r in fake.received if r.path != "/token"]
    assert paths == [
        "/v1/messages", "/v1/messages", "/model/anthropic.claude-sonnet-4-6/invoke",
        "/v1/projects/agentrun-test/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-6:rawPredict",
    ]
    assert [b.get("model") for b in fake.requests[:2]] == ["claude-sonnet-4-6", "claude-sonnet-4-6"]


async def test_a_provider_that_cannot_be_built_fails_the_request_unretried(
    aws: pytest.MonkeyPatch, closing: list[Credentialed | ProviderRouter]
) -> None:
    router = build_router(LlmSettings(), api_key="k", environ={})
    closing.append(router)

    with pytest.raises(LlmError) as caught:
        await router.send(LlmRequest("vertex/claude-sonnet-4-6", 64, [{"role": "user", "content": "hi"}]))

    assert caught.value.status == 400 and not caught.value.retryable and "CLOUD_ML_REGION" in caught.value.message
