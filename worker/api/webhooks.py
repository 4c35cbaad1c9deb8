"""The API's check of a `webhook` it is given (a run's, an agent's): the URL policy, the configured secrets
(core/webhooks.py) and the sender's HTTP client (runtime/webhooks.py), answered as a 422 naming the field."""

from __future__ import annotations

from typing import Any

from agentrun.worker.api.errors import ApiError
from agentrun.worker.api.schemas import FieldProblem
from agentrun.worker.core.tenants import DEFAULT_TENANT
from agentrun.worker.core.webhooks import Allow, WebhookProblem, check_webhook
from agentrun.worker.runtime.webhooks import WebhookSecrets, sendable
from agentrun.worker.settings import WorkerSettings


class WebhookCheck:
    """Reads the secrets file (re-read when it changes) and AGENTRUN_WEBHOOK_ALLOW of the settings."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.secrets = WebhookSecrets(settings.webhook_secrets_file)
        self.allow = Allow.parse(settings.webhook_allow)

    def __call__(self, webhook: dict[str, Any] | None, prefix: str = "", tenant: str = DEFAULT_TENANT) -> None:
        """`webhook` of a run (or agent, or schedule) of `tenant`: its `secretRef` must name a secret that
        tenant's runs may use (its own, or one of no tenant)."""
        if webhook is None:
            return
        try:
            sendable(check_webhook(webhook, self.secrets.names(tenant), self.allow)["url"], self.allow)
        except WebhookProblem as e:
            raise ApiError(422, f"{prefix}{e}", [FieldProblem(field=prefix + e.field, problem=e.problem)]) from None
