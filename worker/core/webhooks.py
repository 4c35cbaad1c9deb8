"""Completion webhooks, the pure part: what a `webhook` of a run request may be, which addresses a
webhook may reach (the URL is untrusted input), and when a failed delivery is tried again. No I/O."""

from __future__ import annotations

import dataclasses
import ipaddress
import random
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from agentrun.worker.core.errors import WebhookProblem as WebhookProblem

EVENTS = ("finished", "waiting")
"""`finished`: the run reached SUCCEEDED, FAILED, CANCELLED or TIMED_OUT; `waiting`: it parked WAITING."""
MAX_URL_CHARS = 2048

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

REFUSED_NETWORKS: tuple[IpNetwork, ...] = tuple(ipaddress.ip_network(n) for n in (
    "0.0.0.0/8",        # "this network"
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",  # private
    "100.64.0.0/10",    # carrier-grade NAT
    "127.0.0.0/8",      # loopback
    "169.254.0.0/16",   # link-local, with the cloud metadata address 169.254.169.254
    "192.0.0.0/24", "198.18.0.0/15",  # IETF protocol assignments, benchmarking
    "224.0.0.0/4", "240.0.0.0/4", "255.255.255.255/32",  # multicast, reserved, broadcast
    "::/128", "::1/128",  # unspecified, loopback
    "fc00::/7",         # unique local, with the AWS IPv6 metadata address fd00:ec2::254
    "fe80::/10",        # link-local
    "ff00::/8",         # multicast
    "64:ff9b::/96",     # NAT64 (embeds an IPv4 address)
))
"""Where a webhook may not go unless AGENTRUN_WEBHOOK_ALLOW names it: the worker's own host, its cluster
and cloud's internal networks and the metadata service. IPv4-mapped IPv6 addresses are judged as IPv4."""


@dataclasses.dataclass(frozen=True)
class Allow:
    """AGENTRUN_WEBHOOK_ALLOW: host names and addresses or CIDR ranges a webhook may reach though the
    policy refuses them otherwise (tests allow 127.0.0.1; a deployment its own receiver in the cluster)."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[IpNetwork, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> Allow:
        hosts: set[str] = set()
        networks: list[IpNetwork] = []
        for item in (text or "").split(","):
            item = item.strip().lower()
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item.strip("[]"), strict=False))
            except ValueError:
                if not _hostname_ok(item):
                    raise ValueError(f"AGENTRUN_WEBHOOK_ALLOW: {item!r} is neither a host name nor an address or "
                                     "CIDR range") from None
                hosts.add(item.rstrip("."))
        return cls(frozenset(hosts), tuple(networks))

    def host(self, host: str) -> bool:
        return host.lower().rstrip(".") in self.hosts

    def address(self, address: IpAddress) -> bool:
        return any(address.version == n.version and address in n for n in self.networks)


def _hostname_ok(host: str) -> bool:
    labels = host.rstrip(".").split(".")
    # A last label of digits only is no name (RFC 3696 §2): `999.1.1.1` is an address that is not one.
    return (bool(host) and all(0 < len(p) <= 63 and all(c.isalnum() or c == "-" for c in p) for p in labels)
            and not labels[-1].isdigit())


def _plain(address: IpAddress) -> IpAddress:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def address_problem(address: IpAddress, allow: Allow) -> str | None:
    """Why a webhook may not be sent to `address`, or None if it may."""
    plain = _plain(address)
    if allow.address(plain) or allow.address(address):
        return None
    for network in REFUSED_NETWORKS:
        if plain.version == network.version and plain in network:
            return (f"{plain} is in {network}, a loopback, private, link-local, multicast or metadata range; "
                    "AGENTRUN_WEBHOOK_ALLOW must name it to be reached")
    return None


def literal_address(host: str) -> IpAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True)
class Target:
    url: str
    scheme: str
    host: str
    port: int


def parse_url(url: str, allow: Allow, field: str = "webhook.url") -> Target:
    """The URL's parts, if it is an absolute http(s) URL whose host (a literal address) the policy allows;
    a host name is checked again after resolution, each time a delivery is sent (`address_problem`)."""
    if not isinstance(url, str) or not url:
        raise WebhookProblem(field, "must be an http or https URL")
    if len(url) > MAX_URL_CHARS:
        raise WebhookProblem(field, f"must be at most {MAX_URL_CHARS} characters")
    if any(ord(c) < 0x21 or ord(c) == 0x7f for c in url):
        raise WebhookProblem(field, "must not contain spaces or control characters")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise WebhookProblem(field, f"is not a valid URL: {e}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise WebhookProblem(field, "must be an http or https URL")
    host = (parts.hostname or "").lower()
    if not host:
        raise WebhookProblem(field, "must name a host")
    if parts.username is not None or parts.password is not None:
        raise WebhookProblem(field, "must not carry credentials (user:password@); sign with secretRef instead")
    address = literal_address(host)
    if address is None and not _hostname_ok(host):
        raise WebhookProblem(field, f"host {host!r} is not a valid host name")
    if address is not None and not allow.host(host) and (why := address_problem(address, allow)):
        raise WebhookProblem(field, why)
    bare = host.rstrip(".")
    if address is None and (bare == "localhost" or bare.endswith(".localhost")) and not allow.host(host):
        raise WebhookProblem(field, "localhost is the worker itself; AGENTRUN_WEBHOOK_ALLOW must name it")
    return Target(url, scheme, host, port or (443 if scheme == "https" else 80))


def check_webhook(value: Mapping[str, Any], secret_names: Iterable[str] | None, allow: Allow) -> dict[str, Any]:
    """The webhook as stored (`{"url", "events", "secretRef"}`), or WebhookProblem naming the field.
    `secret_names`: the configured secrets (None: not known here, not checked)."""
    extra = set(value) - {"url", "events", "secretRef"}
    if extra:
        raise WebhookProblem(f"webhook.{sorted(extra)[0]}", "is not a webhook field (url, events, secretRef)")
    parse_url(value.get("url"), allow)  # type: ignore[arg-type]
    events = value.get("events", ["finished"])
    if not isinstance(events, list) or not events or not all(isinstance(e, str) for e in events):
        raise WebhookProblem("webhook.events", f"must be a non-empty list of {', '.join(EVENTS)}")
    for i, event in enumerate(events):
        if event not in EVENTS:
            raise WebhookProblem(f"webhook.events[{i}]", f"unknown event {event!r}; one of {', '.join(EVENTS)}")
    ref = value.get("secretRef")
    if not isinstance(ref, str) or not ref:
        raise WebhookProblem("webhook.secretRef", "is required: the name of one of the worker's webhook secrets "
                             "(AGENTRUN_WEBHOOK_SECRETS)")
    if secret_names is not None:
        names = sorted(secret_names)
        if ref not in names:
            configured = ", ".join(names) if names else "none (AGENTRUN_WEBHOOK_SECRETS is not set or empty)"
            raise WebhookProblem("webhook.secretRef", f"names no configured webhook secret; configured: {configured}")
    return {"url": value["url"], "events": list(dict.fromkeys(events)), "secretRef": ref}


@dataclasses.dataclass(frozen=True)
class Backoff:
    """When the next attempt of a failed delivery is due: `first` waits in turn, then each wait doubles up to
    `most`; each jittered by ±`jitter` so a receiver that comes back is not hit by every sender at once.
    After `give_up_seconds` from the delivery's creation it is not tried again."""

    first: tuple[float, ...] = (5.0, 10.0, 30.0)
    most: float = 3600.0
    give_up_seconds: float = 24 * 3600.0
    jitter: float = 0.2

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """The wait after the `failures`-th failed attempt (1: the first)."""
        n = max(failures, 1)
        if n <= len(self.first):
            base = self.first[n - 1]
        else:
            last = self.first[-1] if self.first else 1.0
            base = last * 2.0 ** (n - len(self.first))
        base = min(base, self.most)
        spread = (rng or random).uniform(-self.jitter, self.jitter)
        return max(0.0, base * (1 + spread))

    @classmethod
    def parse(cls, text: str | None, most: float | None, give_up: float | None) -> Backoff:
        first = cls.first
        if text:
            try:
                first = tuple(float(p) for p in text.split(",") if p.strip())
            except ValueError:
                raise ValueError(f"AGENTRUN_WEBHOOK_BACKOFF must be comma-separated seconds, got {text!r}") from None
            if not first or any(not 0 < f < 1e7 for f in first):
                raise ValueError(f"AGENTRUN_WEBHOOK_BACKOFF must be positive seconds, got {text!r}")
        return cls(first, most if most is not None else cls.most,
                   give_up if give_up is not None else cls.give_up_seconds)


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One try at sending a delivery, as the sender saw it."""

    attempt: int
    started_at: Any  # datetime.datetime
    status_code: int | None
    latency_ms: int | None
    error: str | None
    worker: str | None = None


@dataclasses.dataclass(frozen=True)
class Delivery:
    """A webhook the outbox owes: one status change of one run, sent until it is answered 2xx or given up."""

    id: Any  # uuid.UUID: the `webhook-id`, the same on every attempt
    run_id: Any  # uuid.UUID
    event: str
    run_status: str
    url: str
    secret_ref: str
    state: str  # PENDING, DELIVERED or FAILED (given up)
    attempts: int
    next_at: Any  # datetime.datetime
    created_at: Any  # datetime.datetime
    done_at: Any = None
    last_error: str | None = None
    history: tuple[Attempt, ...] = ()
