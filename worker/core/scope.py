"""Whose runs a caller may read: the scope every read that serves a caller is made in (store/scoped.py).

Today an identity with `read` sees every run; tenants (one fleet, many teams) will narrow it to the
identity's tenant. The rule of what a scope sees is written once, in store/scoped.py, so that narrowing is
one change in one place."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Scope:
    """Who reads: `identity` is the API identity asking (None: the runtime itself, a worker or the operator,
    which sees every run)."""

    identity: str | None = None

    @property
    def everything(self) -> bool:
        """Whether the scope sees every run (today every scope does)."""
        return True


SYSTEM = Scope()
"""The scope of the runtime's own reads: every run."""
