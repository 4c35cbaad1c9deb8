"""Google Vertex AI: Claude through `anthropic.AsyncAnthropicVertex`, project and region from the environment.

The region comes from CLOUD_ML_REGION, the project from ANTHROPIC_VERTEX_PROJECT_ID (else from the
credentials); credentials are Application Default Credentials: GKE workload identity, or a key file
named by GOOGLE_APPLICATION_CREDENTIALS. ANTHROPIC_VERTEX_BASE_URL points it elsewhere (a Private
Service Connect endpoint, a local server in tests).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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

NAME = "vertex"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"


def vertex_client(env: Mapping[str, str], http_timeout: float) -> Credentialed:
    """The Vertex client; ProviderUnavailable naming what is missing."""
    require("google.auth", NAME, "vertex")
    region = env.get("CLOUD_ML_REGION") or ""
    if not region:
        raise ProviderUnavailable(f"{NAME}: no region: set CLOUD_ML_REGION (us-east5, europe-west1, global, ...)")
    project = env.get("ANTHROPIC_VERTEX_PROJECT_ID") or None
    credentials = None
    if project is None:
        # The SDK builds the request's URL, which holds the project, before it loads credentials: so the
        # project of the credentials (a key file's, GOOGLE_CLOUD_PROJECT, the GKE metadata server's) is
        # looked up here, once. The credentials found are kept for the requests.
        credentials, project = _default_credentials()
    sdk = anthropic.AsyncAnthropicVertex(
        region=region,
        project_id=project,
        credentials=credentials,
        base_url=env.get("ANTHROPIC_VERTEX_BASE_URL") or None,
        timeout=http_timeout,
        max_retries=0,
    )
    return Credentialed(AnthropicClient(sdk=sdk), classify)


def _default_credentials() -> tuple[Any, str]:
    import google.auth
    import google.auth.exceptions as gauth

    try:
        credentials, project = google.auth.default(scopes=[CLOUD_PLATFORM])
    except gauth.GoogleAuthError as e:
        raise ProviderUnavailable(f"{NAME}: no credentials: {e}") from None
    if not project:
        raise ProviderUnavailable(f"{NAME}: no project: set ANTHROPIC_VERTEX_PROJECT_ID")
    return credentials, str(project)


def classify(e: Exception) -> LlmError | None:
    """google-auth's errors while finding or refreshing credentials; a network error is retried."""
    import google.auth.exceptions as gauth

    if isinstance(e, gauth.TransportError):
        return LlmError(-1, None, f"{NAME}: credentials: {type(e).__name__}: {e}")
    if isinstance(e, gauth.RefreshError) and getattr(e, "retryable", False):
        return LlmError(-1, None, f"{NAME}: credentials: {type(e).__name__}: {e}")
    if isinstance(e, gauth.GoogleAuthError):
        return failure(NO_CREDENTIALS, NAME, "credentials", e)
    if isinstance(e, RuntimeError | ValueError):  # no project id, from the environment or the credentials
        return failure(NOT_CONFIGURED, NAME, "configuration", e)
    return None
