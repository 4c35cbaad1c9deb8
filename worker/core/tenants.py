"""Tenants (issue 46): whom a run belongs to, and the names a tenant may have.

A tenant is a name in Kubernetes' DNS-label syntax (a namespace's name is one, so a namespace maps to the
tenant of its own name by default). Runs that name none are the tenant `default`. An API identity of the
tenant `*` is a platform operator's: it belongs to no one tenant and, with `admin`, sees every tenant's runs.
"""

from __future__ import annotations

import re

DEFAULT_TENANT = "default"
"""The tenant of runs and identities that name none (and of every run made before tenants existed)."""

ALL_TENANTS = "*"
"""The tenant of a platform operator's identity: it acts for every tenant."""

TENANT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""A DNS label, as a Kubernetes namespace's name (and the tenant table's CHECK) has it."""


def tenant_problem(name: object, where: str = "tenant") -> str | None:
    """Why `name` is not a tenant's name, or None if it is one."""
    if not isinstance(name, str) or not TENANT_NAME.fullmatch(name):
        return (f"{where}: {name!r} is not a tenant name: 1 to 63 lower-case letters, digits or '-', "
                "starting and ending with a letter or digit")
    return None
