"""The run table and its step log, through one gateway: `RunStore`.

Every write to a held run is fenced: it names the worker and the RUNNING status in its WHERE clause, and
zero rows means the lease is gone (`LeaseLost`). The store is split by concern, one module each, and
`RunStore` is all of them over one pool:
- submit.py: new runs (fresh, continued, forked) and cancel requests
- reads.py: runs and steps as the API, the CLI and the operator read them
- scoped.py: the one scoped door for the reads that serve a caller (`RunStore.scoped`)
- claims.py: claims, leases, liveness, handing a run back
- steps.py: the fenced writes of a held run (group-committed, groupcommit.py)
- decisions.py: runs parked for people, their decisions, reconcile probes
- children.py: sub-agents' child runs, the parent's wait for them, cancels that cascade
- agents.py: agent definitions, versioned, and their resolution for a new run
- messages.py: messages posted to a running run, and their delivery as USER steps
- schedules.py: schedules, and their ticks, each made with its run in one transaction
- waits.py: durable timers and waits for outside events, the sweep that wakes them, events posted
- webhooks.py: the webhook outbox (deliveries the run table's trigger writes) and its attempts
- workers.py: the worker processes at work, each announcing itself on its heartbeat
- tenants.py: tenants' quotas and usage, a new run admitted under them, a run handed back over its budget
- replays.py: replays as their callers read them, and each replay run's verdict, written once
- rows.py: the columns, the fence and the records rows become; gateway.py: the pool and query helpers
"""

from __future__ import annotations

from agentrun.worker.core.viewer import Viewer
from agentrun.worker.store.agents import Agents
from agentrun.worker.store.children import Children
from agentrun.worker.store.claims import Claims
from agentrun.worker.store.decisions import Decisions
from agentrun.worker.store.messages import Messages
from agentrun.worker.store.reads import Reads
from agentrun.worker.store.replays import Replays
from agentrun.worker.store.schedules import Schedules
from agentrun.worker.store.scoped import ScopedReads
from agentrun.worker.store.steps import StepWrites
from agentrun.worker.store.submit import Submissions
from agentrun.worker.store.tenants import Tenants
from agentrun.worker.store.waits import Waits
from agentrun.worker.store.webhooks import Webhooks
from agentrun.worker.store.workers import Workers


class RunStore(
    Schedules, Submissions, Reads, Claims, StepWrites, Decisions, Children, Agents, Messages, Waits, Webhooks,
    Workers, Tenants, Replays,
):
    """The run tables' one gateway. `writes` sends the fenced writes of held runs; by default they are
    group-committed (groupcommit.py)."""

    def scoped(self, viewer: Viewer) -> ScopedReads:
        """The reads that serve a caller, as far as its viewer sees: the API reads runs through nothing else."""
        return ScopedReads(self, viewer)
