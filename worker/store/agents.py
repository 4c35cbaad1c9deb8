"""Agent definitions, versioned: stored, read, deleted, and resolved for a run at its submission."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from agentrun.worker.core.agents import Agent, parse_ref, same_definition, with_agent
from agentrun.worker.core.errors import Problem, Refusal, Refused
from agentrun.worker.core.submission import RunSpec
from agentrun.worker.core.tenants import DEFAULT_TENANT
from agentrun.worker.core.text import unstorable
from agentrun.worker.store.gateway import Gateway

AGENT_COLUMNS = """v.name, v.version, v.description, v.system, v.model, v.tools, v.require_approval, v.output_schema,
    v.max_steps, v.token_budget, v.cost_budget_usd, v.timeout_seconds, v.sub_agents, v.webhook,
    v.context_management, v.created_at, v.created_by, v.tenant"""

RETURNED = AGENT_COLUMNS.replace("v.", "")  # the same columns, of the row an INSERT returns

_LATEST = f"""SELECT {AGENT_COLUMNS} FROM agent_version v WHERE v.tenant = %(tenant)s AND v.name = %(name)s
    ORDER BY v.version DESC LIMIT 1"""


def _agent(row: dict[str, Any]) -> Agent:
    row = dict(row)
    for attr in ("tools", "require_approval", "sub_agents"):
        if row[attr] is not None:
            row[attr] = tuple(row[attr])
    return Agent(**row)


class Agents(Gateway):
    async def put_agent(self, agent: Agent, created_by: str | None = None) -> tuple[Agent, bool]:
        """Store `agent` (its version ignored) as a new version unless the latest has the same definition.

        Returns the version stored (or the identical latest) and whether it is new. A deleted name is
        undeleted. Puts of one name serialise on its `agent` row, so two at once never make two equal
        versions. The agent is `agent.tenant`'s. Raises ValueError naming the field if a text cannot be stored
        (a NUL character)."""
        texts = {"description": agent.description, "system": agent.system, "model": agent.model,
                 **{f"tools[{i}]": t for i, t in enumerate(agent.tools or ())},
                 **{f"requireApproval[{i}]": t for i, t in enumerate(agent.require_approval or ())},
                 **{f"subAgents[{i}]": t for i, t in enumerate(agent.sub_agents or ())}}
        for field, text in texts.items():
            if (why := unstorable(text)) is not None:
                raise ValueError(f"{field} {why}")
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            # The upsert takes the row lock even when the row exists; a waiting put then reads, in its
            # next statement's snapshot, the version the first one committed.
            await cur.execute(
                b"""INSERT INTO agent (tenant, name) VALUES (%(tenant)s, %(name)s)
                    ON CONFLICT (tenant, name) DO UPDATE SET deleted_at = NULL""",
                {"tenant": agent.tenant, "name": agent.name})
            await cur.execute(_LATEST.encode(), {"tenant": agent.tenant, "name": agent.name})
            row = await cur.fetchone()
            latest = _agent(row) if row else None
            if latest is not None and same_definition(latest, agent):
                return latest, False
            await cur.execute(
                f"""INSERT INTO agent_version (name, version, description, system, model, tools, require_approval,
                        output_schema, max_steps, token_budget, cost_budget_usd, timeout_seconds, sub_agents,
                        created_by, webhook, context_management, tenant)
                    VALUES (%(name)s, %(version)s, %(description)s, %(system)s, %(model)s, %(tools)s,
                        %(require_approval)s, %(output_schema)s, %(max_steps)s, %(token_budget)s,
                        %(cost_budget_usd)s, %(timeout_seconds)s, %(sub_agents)s, %(created_by)s,
                        %(webhook)s, %(context)s, %(tenant)s)
                    RETURNING {RETURNED}""".encode(),
                {
                    "name": agent.name, "version": (latest.version if latest else 0) + 1,
                    "description": agent.description, "system": agent.system, "model": agent.model,
                    "tools": _array(agent.tools), "require_approval": _array(agent.require_approval),
                    "output_schema": Jsonb(agent.output_schema) if agent.output_schema is not None else None,
                    "max_steps": agent.max_steps, "token_budget": agent.token_budget,
                    "cost_budget_usd": agent.cost_budget_usd, "timeout_seconds": agent.timeout_seconds,
                    "sub_agents": _array(agent.sub_agents), "created_by": created_by,
                    "webhook": Jsonb(agent.webhook) if agent.webhook is not None else None,
                    "context": Jsonb(agent.context_management) if agent.context_management is not None else None,
                    "tenant": agent.tenant,
                },
            )
            stored = await cur.fetchone()
            assert stored is not None
            return _agent(stored), True

    async def agent(
        self, name: str, version: int | None = None, *, deleted: bool = False, tenant: str = DEFAULT_TENANT,
    ) -> Agent | None:
        """A version of `tenant`'s agent (None: the latest); None if unknown, or deleted (unless `deleted`)."""
        row = await self._one(
            f"""SELECT {AGENT_COLUMNS} FROM agent a JOIN agent_version v ON v.tenant = a.tenant AND v.name = a.name
                WHERE a.tenant = %(tenant)s AND a.name = %(name)s
                  AND (%(version)s::int IS NULL OR v.version = %(version)s) AND (%(deleted)s OR a.deleted_at IS NULL)
                ORDER BY v.version DESC LIMIT 1""",
            {"name": name, "version": version, "deleted": deleted, "tenant": tenant},
        )
        return _agent(row) if row else None

    async def agents(self, tenant: str = DEFAULT_TENANT) -> list[Agent]:
        """The latest version of each of `tenant`'s agents not deleted, by name."""
        rows = await self._all(
            f"""SELECT DISTINCT ON (v.name) {AGENT_COLUMNS} FROM agent a
                JOIN agent_version v ON v.tenant = a.tenant AND v.name = a.name
                WHERE a.tenant = %(tenant)s AND a.deleted_at IS NULL ORDER BY v.name, v.version DESC""",
            {"tenant": tenant})
        return [_agent(r) for r in rows]

    async def agent_versions(self, name: str, tenant: str = DEFAULT_TENANT) -> list[Agent]:
        """Every version of `tenant`'s agent, oldest first (deleted or not: runs may be pinned to any)."""
        rows = await self._all(
            f"""SELECT {AGENT_COLUMNS} FROM agent_version v WHERE v.tenant = %(tenant)s AND v.name = %(name)s
                ORDER BY v.version""",
            {"name": name, "tenant": tenant})
        return [_agent(r) for r in rows]

    async def delete_agent(self, name: str, tenant: str = DEFAULT_TENANT) -> bool:
        """Refuse new runs of `tenant`'s agent (runs in flight finish); False if there is none (or it was
        deleted)."""
        row = await self._one(
            """UPDATE agent SET deleted_at = now()
               WHERE tenant = %(tenant)s AND name = %(name)s AND deleted_at IS NULL RETURNING name""",
            {"name": name, "tenant": tenant})
        return row is not None

    async def resolve_sub_agents(self, names: Sequence[str], tenant: str = DEFAULT_TENANT) -> tuple[str, ...]:
        """Each `name` or `name@N` of `tenant`'s agents pinned to `name@version` (the latest when no @N), each
        once, in order.

        Raises Refused (NOT_FOUND, or INVALID for a malformed one) naming `subAgents[i]`."""
        pinned: list[str] = []
        for i, text in enumerate(names):
            name, version = parse_ref(text, f"subAgents[{i}]")
            found = await self.agent(name, version, tenant=tenant)
            if found is None:
                raise _unknown(f"subAgents[{i}]", name, version)
            pinned.append(found.ref)
        return tuple(dict.fromkeys(pinned))

    async def for_run(
        self, spec: RunSpec, tenant: str = DEFAULT_TENANT,
    ) -> tuple[RunSpec, Agent | None, tuple[str, ...] | None]:
        """`spec` with its agent applied (`with_agent`), the agent, and the sub-agents it ends with pinned:
        `tenant`'s, the tenant the run is made for.

        Raises Refused: NOT_FOUND naming `agent` or `subAgents[i]`; INVALID for an agent named on a
        continuation or fork (it keeps its source's) or a budget raised above the agent's."""
        agent = None
        if spec.agent is not None:
            if spec.continue_from is not None or spec.fork_from is not None:
                problem = "a continuation or fork keeps the agent of the run it goes on from"
                raise Refused.of(Refusal.INVALID, [Problem("agent", problem)])
            name, version = spec.agent
            agent = await self.agent(name, version, tenant=tenant)
            if agent is None:
                raise _unknown("agent", name, version)
            spec = with_agent(spec, agent)
        sub_agents = await self.resolve_sub_agents(spec.sub_agents, tenant) if spec.sub_agents is not None else None
        return spec, agent, sub_agents


def _unknown(field: str, name: str, version: int | None) -> Refused:
    problem = f"no agent {name!r}" if version is None else f"no version {version} of agent {name!r}"
    return Refused(Refusal.NOT_FOUND, f"{field}: {problem}", [Problem(field, problem)])


def _array(values: tuple[str, ...] | None) -> list[str] | None:
    return list(values) if values is not None else None
