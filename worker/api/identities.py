"""Who may call the API: named identities with scopes, from the tokens file and AGENTRUN_API_TOKEN.

The file (`AGENTRUN_API_TOKENS`, YAML or JSON) holds `identities: [{name, sha256, scopes, tenant}]`: the
hex SHA-256 of each token, never the token, and the tenant whose runs the identity sees and acts on
(`default` when not given; `"*"` for a platform operator's identity, which acts for every tenant; so does
AGENTRUN_API_TOKEN's). It is re-read when it changes, so tokens rotate without a restart.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from agentrun.worker.api.errors import IdentityFileError as IdentityFileError
from agentrun.worker.core.tenants import ALL_TENANTS, DEFAULT_TENANT, tenant_problem
from agentrun.worker.core.watched import Look, WatchedFile

log = logging.getLogger("agentrun.worker.api")

DEFAULT_IDENTITY = "default"
"""The name of the identity AGENTRUN_API_TOKEN stands for; it has every scope."""

TOKEN_PREFIX = "agrt_"
"""What `agentrun token new` tokens start with, so a leaked one is recognisable (and redacted in logs)."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:/-]{0,127}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class Scope(str, enum.Enum):
    """What an identity may do. `admin` implies all the others."""

    READ = "read"  # get, list, timeline, steps (and events, pending decisions, the UI when they exist)
    SUBMIT = "submit"  # create a run (and continue, fork)
    DECIDE = "decide"  # approve or reject pending decisions (issue 13: no endpoint yet)
    CANCEL = "cancel"  # cancel a run
    SIGNAL = "signal"  # post an event (POST /api/events) and nothing else; `submit` implies it
    ADMIN = "admin"  # everything


@dataclasses.dataclass(frozen=True)
class Identity:
    name: str
    scopes: frozenset[Scope]
    tenant: str = DEFAULT_TENANT  # whose runs it sees and acts on; "*": every tenant's (a platform operator's)

    @property
    def all_tenants(self) -> bool:
        """A platform operator's identity: it sees and acts on every tenant's runs."""
        return self.tenant == ALL_TENANTS

    def allows(self, scope: Scope) -> bool:
        if scope is Scope.SIGNAL and Scope.SUBMIT in self.scopes:  # submit is the wider of the two
            return True
        return Scope.ADMIN in self.scopes or scope in self.scopes

    @property
    def effective_scopes(self) -> list[Scope]:
        """Every scope this identity holds, `admin` expanded, in declaration order."""
        return [s for s in Scope if self.allows(s)]


def digest(token: str | bytes) -> bytes:
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).digest()


def parse_scopes(text: str | Iterable[str], where: str = "scopes") -> frozenset[Scope]:
    items = [s.strip() for s in (text.split(",") if isinstance(text, str) else map(str, text))]
    items = [s for s in items if s]
    known = ", ".join(s.value for s in Scope)
    scopes = set()
    for item in items:
        try:
            scopes.add(Scope(item))
        except ValueError:
            raise IdentityFileError(f"{where}: unknown scope {item!r}; the scopes are: {known}") from None
    if not scopes:
        raise IdentityFileError(f"{where}: no scopes; give at least one of: {known}")
    return frozenset(scopes)


def parse(text: str, source: str, reserved: Sequence[str] = ()) -> list[tuple[Identity, bytes]]:
    """The identities of a tokens file, each with its token's SHA-256 digest; IdentityFileError if malformed."""
    import yaml  # YAML is a superset of JSON: one parser reads both

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise IdentityFileError(f"{source}: not YAML or JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("identities"), list):
        raise IdentityFileError(f"{source}: must be a mapping with an `identities` list")
    found: list[tuple[Identity, bytes]] = []
    names: set[str] = set(reserved)
    hashes: set[bytes] = set()
    for i, entry in enumerate(doc["identities"]):
        where = f"{source}: identities[{i}]"
        if not isinstance(entry, Mapping):
            raise IdentityFileError(f"{where}: must be a mapping of name, sha256, scopes and tenant")
        unknown = set(entry) - {"name", "sha256", "scopes", "tenant"}
        if unknown:
            raise IdentityFileError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        name, hexdigest, scopes = entry.get("name"), entry.get("sha256"), entry.get("scopes")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise IdentityFileError(f"{where}.name: must be 1 to 128 letters, digits or ._@:/- starting "
                                    "with a letter or digit")
        if name in names:
            taken = " (the identity of AGENTRUN_API_TOKEN)" if name in reserved else ""
            raise IdentityFileError(f"{where}.name: {name!r} is used twice{taken}")
        # The value is a hash, not a secret, but a token pasted here by mistake must not be echoed.
        if not isinstance(hexdigest, str) or not _SHA256.fullmatch(hexdigest.strip().lower()):
            raise IdentityFileError(f"{where}.sha256: must be the 64 hex digits of the token's SHA-256 "
                                    "(`agentrun token new` prints it), not the token itself")
        hashed = bytes.fromhex(hexdigest.strip())
        if hashed in hashes:
            raise IdentityFileError(f"{where}.sha256: the same token is given to two identities")
        if not isinstance(scopes, list | str):
            raise IdentityFileError(f"{where}.scopes: must be a list of scopes")
        tenant = _tenant(entry.get("tenant", DEFAULT_TENANT), f"{where}.tenant")
        found.append((Identity(name, parse_scopes(scopes, f"{where}.scopes"), tenant), hashed))
        names.add(name)
        hashes.add(hashed)
    return found


def _tenant(tenant: object, where: str) -> str:
    """`tenant` if it names a tenant or every one ("*"); IdentityFileError naming `where` if not."""
    if tenant != ALL_TENANTS and (bad := tenant_problem(tenant, where)) is not None:
        raise IdentityFileError(f'{bad}, or "*" for an identity of every tenant')
    assert isinstance(tenant, str)
    return tenant


class Identities:
    """Finds the identity a bearer token stands for, re-reading the tokens file when it changes.

    The file is looked at (one `stat`) at most every `recheck_seconds`, and read again only when its
    inode, size or mtime changed: a Kubernetes Secret volume swaps a symlink, which changes the inode.
    A file that has become unreadable or malformed admits no one from it (fail closed) until it is fixed.
    """

    def __init__(self, token: str | None = None, path: str | None = None, recheck_seconds: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.recheck_seconds = recheck_seconds
        self._clock = clock
        self._fixed: list[tuple[Identity, bytes]] = []
        if token:
            self._fixed.append((Identity(DEFAULT_IDENTITY, frozenset(Scope), ALL_TENANTS), digest(token)))
        self._from_file: list[tuple[Identity, bytes]] = []
        self._file = WatchedFile(path, recheck_seconds, clock) if path is not None else None
        if self._file is not None:
            self._from_file = self._load(self._file)  # at start, a bad file is an error, not a warning

    @property
    def enabled(self) -> bool:
        """Whether the API requires a token at all (a token or a tokens file is configured)."""
        return bool(self._fixed) or self.path is not None

    def _load(self, file: WatchedFile) -> list[tuple[Identity, bytes]]:
        try:
            text = file.read()
        except (OSError, UnicodeDecodeError) as e:
            raise IdentityFileError(f"cannot read the tokens file {file.path} (AGENTRUN_API_TOKENS): "
                                    f"{getattr(e, 'strerror', None) or e}") from None
        reserved = [DEFAULT_IDENTITY] if self._fixed else []
        return parse(text, file.path, reserved)

    def _refresh(self) -> None:
        if self._file is None:
            return
        look = self._file.look()
        if look is Look.GONE:
            strerror = self._file.error.strerror if self._file.error else None
            log.error("tokens file %s is gone (%s): no token from it is accepted", self.path, strerror)
            self._from_file = []
        elif look is Look.CHANGED:
            try:
                self._from_file = self._load(self._file)
            except IdentityFileError as e:
                log.error("%s; no token from it is accepted until it is fixed", e)
                self._from_file = []
                return
            log.info("tokens file %s read: %d identities", self.path, len(self._from_file))

    def authenticate(self, token: bytes) -> Identity | None:
        """The identity whose token this is, or None. Takes the same time whichever entry matches."""
        self._refresh()
        given = digest(token)
        found: Identity | None = None
        # Every entry is compared, with no early exit, so timing tells nothing about which one matched.
        for identity, expected in [*self._fixed, *self._from_file]:
            if hmac.compare_digest(given, expected):
                found = identity
        return found


@dataclasses.dataclass(frozen=True)
class NewToken:
    token: str
    sha256: str
    entry: dict[str, Any]


def new_token(name: str, scopes: frozenset[Scope], tenant: str = DEFAULT_TENANT) -> NewToken:
    """A random token for `name`, of `tenant`, and the entry of the tokens file that admits it."""
    if not _NAME.fullmatch(name):
        raise IdentityFileError(f"name {name!r}: must be 1 to 128 letters, digits or ._@:/- starting with a "
                                "letter or digit")
    tenant = _tenant(tenant, "tenant")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    hexdigest = hashlib.sha256(token.encode()).hexdigest()
    entry = {"name": name, "sha256": hexdigest, "scopes": [s.value for s in Scope if s in scopes],
             "tenant": tenant}
    return NewToken(token, hexdigest, entry)
