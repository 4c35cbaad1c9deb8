"""Amazon Bedrock: Claude through `anthropic.AsyncAnthropicBedrock`, region and credentials from the AWS chain.

The region comes from AWS_REGION or AWS_DEFAULT_REGION (else the profile's); credentials from the
standard chain (environment keys, IRSA's web identity token, a profile, instance metadata), or an API
key in AWS_BEARER_TOKEN_BEDROCK. ANTHROPIC_BEDROCK_BASE_URL points it elsewhere (a VPC endpoint, a
local server in tests).
"""

from __future__ import annotations

from collections.abc import Mapping

import anthropic

from agentrun.worker.core.types import LlmError
from agentrun.worker.llm.anthropic_client import AnthropicClient
from agentrun.worker.llm.cloud import (
    NO_CREDENTIALS,
    NOT_CONFIGURED,
    Credentialed,
    ProviderUnavailable,
    failure,
    require,
)

NAME = "bedrock"


def bedrock_client(env: Mapping[str, str], http_timeout: float) -> Credentialed:
    """The Bedrock client; ProviderUnavailable naming what is missing."""
    require("boto3", NAME, "bedrock")
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
    try:
        sdk = anthropic.AsyncAnthropicBedrock(
            aws_region=region,
            api_key=env.get("AWS_BEARER_TOKEN_BEDROCK") or None,
            base_url=env.get("ANTHROPIC_BEDROCK_BASE_URL") or None,
            timeout=http_timeout,
            max_retries=0,
        )
    except (ValueError, anthropic.AnthropicError) as e:  # no region anywhere
        raise ProviderUnavailable(f"{NAME}: {e}") from None
    return Credentialed(AnthropicClient(sdk=sdk), classify)


def classify(e: Exception) -> LlmError | None:
    """botocore's errors while resolving or using credentials; a network error reaching STS is retried."""
    import botocore.exceptions as boto

    if isinstance(e, boto.EndpointConnectionError | boto.ConnectTimeoutError | boto.ReadTimeoutError):
        return LlmError(-1, None, f"{NAME}: credentials: {type(e).__name__}: {e}")
    if isinstance(e, boto.BotoCoreError | boto.ClientError):
        return failure(NO_CREDENTIALS, NAME, "credentials", e)
    if isinstance(e, RuntimeError):  # "Could not resolve AWS credentials from session"
        return failure(NO_CREDENTIALS, NAME, "credentials", e)
    if isinstance(e, ValueError):
        return failure(NOT_CONFIGURED, NAME, "request", e)
    return None
