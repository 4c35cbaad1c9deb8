"""Who reads: the viewer every read that serves a caller is made for (store/scoped.py).

Today an identity with `read` sees every run; tenants (one fleet, many teams) will narrow it to the
identity's tenant. The rule of what a viewer sees is written once, in store/scoped.py, so that narrowing is
one change in one place."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Viewer:
    """Who reads: `identity` is the API identity asking (None: an open API, or the runtime itself, a worker
    or the operator, which sees every run)."""

    identity: str | None = None

    @property
    def sees_everything(self) -> bool:
        """Whether the viewer sees every run (today every viewer does)."""
        return True


SYSTEM = Viewer()
"""The viewer of the runtime's own reads: every run."""
