"""ProviderRouter: the `LlmClient` that sends each request to the provider its model's prefix names."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping

from agentrun.worker.core.types import LlmClient, LlmError, LlmRequest, LlmResponse
from agentrun.worker.llm.cloud import NOT_CONFIGURED, ProviderUnavailable
from agentrun.worker.llm.providers import split

log = logging.getLogger(__name__)

Factory = Callable[[], LlmClient]


class ProviderRouter:
    """Strips the prefix (`bedrock/`, `vertex/`, `<endpoint>/`, `anthropic/`) and calls that provider's client.

    Clients are built on first use, so a worker that never runs a Bedrock model needs no AWS setup;
    a provider that cannot be built fails the run asking for it, with the reason, and is tried again
    for the next run (the environment may have been fixed by a restart of the credential agent).
    Retrying and time limits sit outside, so every provider gets the same policy.
    """

    def __init__(self, factories: Mapping[str, Factory]) -> None:
        self._factories = dict(factories)
        self._clients: dict[str, LlmClient] = {}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._factories)

    def client(self, provider: str) -> LlmClient:
        """The client of `provider`, built now if it is the first use; ProviderUnavailable if it cannot be."""
        if (client := self._clients.get(provider)) is not None:
            return client
        factory = self._factories.get(provider)
        if factory is None:
            raise ProviderUnavailable(f"unknown model provider {provider!r}; known providers: {', '.join(self.names)}")
        client = self._clients[provider] = factory()
        log.info("model provider %s ready", provider)
        return client

    async def aclose(self) -> None:
        """Close the clients built so far (their HTTP connection pools)."""
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            close = getattr(client, "aclose", None)
            if close is not None:
                await close()

    async def send(self, request: LlmRequest) -> LlmResponse:
        model = split(request.model)
        if not model.id.strip():
            raise LlmError(NOT_CONFIGURED, None, f"model {request.model!r} names no model after {model.provider}/")
        try:
            client = self.client(model.provider)
        except ProviderUnavailable as e:
            raise LlmError(NOT_CONFIGURED, None, str(e)) from None
        return await client.send(dataclasses.replace(request, model=model.id))


async def close_client(client: object) -> None:
    """Closes the HTTP connections of `client`, found through the decorators around it (each keeps the
    client it wraps as `delegate`): the first `aclose` on the way is called. A worker calls it on its way
    out, so an aiohttp session is closed by its loop instead of being reported unclosed at exit."""
    while client is not None:
        close = getattr(client, "aclose", None)
        if close is not None:
            await close()
            return
        client = getattr(client, "delegate", None)
