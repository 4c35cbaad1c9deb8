"""The kopf handlers of Agent resources: each change of spec is stored as a new version of the agent
(an unchanged one, as at every operator start, as none); deleting the resource deletes the agent.

Agent names are one per database, Agents are namespaced: the name is the resource's metadata.name, and
the namespace of the Agent that made an agent's latest version owns the name (it is in the version's
`created_by`, `k8s:<namespace>/<manager>`). An Agent of the same name in another namespace is refused in
its status, and its deletion leaves the agent alone; so does that of an Agent whose spec was never stored
over a definition made through the REST API.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import kopf

from agentrun.operator import mapping
from agentrun.worker.core.agents import Agent
from agentrun.worker.core.errors import Refused
from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.store import RunStore

log = logging.getLogger("agentrun.operator.agents")

T = TypeVar("T")
Guarded = Callable[[Callable[[RunStore], Awaitable[T]], str, int], Awaitable[T]]


class Agents:
    """Agent resources ⇄ the agent table, through the store."""

    def __init__(self, known_tools: frozenset[str] | None, prices: PriceTable, guarded: Guarded[Any],
                 tenant_of: Callable[[str], str] = lambda namespace: namespace) -> None:
        self.known_tools = known_tools
        self.prices = prices
        self.tenant_of = tenant_of  # a namespace's tenant, whose agent an Agent of it is
        # Runs a call on the store; a database not there yet or unreachable becomes a TemporaryError
        # kopf retries with backoff.
        self.guarded = guarded

    async def reconcile(self, body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, retry: int) -> None:
        """Store the spec as the agent's latest version (a new one only if it changed) and show it."""
        meta = body.get("metadata") or {}
        namespace, name, generation = meta.get("namespace") or "", meta["name"], meta.get("generation")
        previous = dict(body.get("status") or {})
        now = datetime.datetime.now(datetime.UTC)

        def refuse(reason: str, message: str) -> None:
            log.warning("agent %s/%s not stored: %s", namespace, name, message)
            status = mapping.agent_refused_status(reason, message, generation, previous, now)
            patch.status.update(mapping.status_patch(previous, status))

        tenant = self.tenant_of(namespace)
        try:
            agent = dataclasses.replace(mapping.agent_definition(name, spec, self.known_tools, self.prices),
                                        tenant=tenant)
        except mapping.InvalidSpec as e:
            return refuse("InvalidSpec", str(e))
        latest: Agent | None = await self.guarded(lambda s: s.agent(name, tenant=tenant), "read the agent", retry)
        owner = mapping.agent_owner(latest.created_by) if latest is not None else None
        if owner is not None and owner != namespace:
            return refuse("NameConflict", _conflict(name, owner, tenant))
        if agent.sub_agents:
            try:
                subs = agent.sub_agents
                await self.guarded(lambda s: s.resolve_sub_agents(subs, tenant), "check the sub-agents", retry)
            except Refused as e:
                return refuse("InvalidSpec", f"spec.{e.message}")
        by = mapping.agent_creator(body)
        stored, created = await self.guarded(lambda s: s.put_agent(agent, created_by=by), "store the agent", retry)
        log.info("agent %s/%s: version %s%s", namespace, name, stored.version, " (new)" if created else "")
        status = mapping.agent_status(stored, created, generation, previous, now)
        patch.status.update(mapping.status_patch(previous, status))

    async def deleted(self, body: kopf.Body, retry: int) -> None:
        """Delete the agent (new runs naming it are refused; runs in flight finish) if this Agent made
        its latest version: not when another namespace's Agent or the REST API did."""
        meta = body.get("metadata") or {}
        namespace, name = meta.get("namespace") or "", meta["name"]
        tenant = self.tenant_of(namespace)
        latest: Agent | None = await self.guarded(lambda s: s.agent(name, tenant=tenant), "read the agent", retry)
        if latest is None:
            return
        owner = mapping.agent_owner(latest.created_by)
        if owner != namespace:
            # Another namespace's Agent, or the REST API, made the version runs get: not this one's to delete.
            log.info("agent %s/%s deleted: its latest version is %s's, left alone", namespace, name,
                     f"namespace {owner}'s" if owner else "the REST API's")
            return
        await self.guarded(lambda s: s.delete_agent(name, tenant), "delete the agent", retry)
        log.info("agent %s/%s deleted", namespace, name)


def _conflict(name: str, owner: str, tenant: str) -> str:
    return (f"the agent name {name!r} is taken by the Agent in namespace {owner!r} (agent names are one per "
            f"tenant, and both namespaces are tenant {tenant!r}'s): rename this one, or delete that one first")
