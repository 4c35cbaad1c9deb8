"""Who reads: the viewer every read that serves a caller is made for (store/scoped.py).

A viewer sees its tenant's runs (issue 46): an API identity's tenant, or every tenant for a platform
operator's identity (tenant `*`), an open API, and the runtime itself (a worker, the operator). The rule of
what a viewer sees is written once, in store/scoped.py."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Viewer:
    """Who reads: `identity` is the API identity asking (None: an open API, or the runtime itself, a worker
    or the operator); `tenant` the tenant whose runs it sees (None: every tenant's)."""

    identity: str | None = None
    tenant: str | None = None

    @property
    def sees_everything(self) -> bool:
        """Whether the viewer sees every tenant's runs."""
        return self.tenant is None

    def sees_tenant(self, tenant: str) -> bool:
        """Whether a run, agent, schedule or event of `tenant` exists for this viewer."""
        return self.tenant is None or self.tenant == tenant


SYSTEM = Viewer()
"""The viewer of the runtime's own reads: every run."""
