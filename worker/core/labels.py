"""Run labels and label selectors, in Kubernetes' syntax, so that a label an AgentRun carries means the same
on its run and a selector a user knows from kubectl finds the same runs."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

MAX_LABELS = 64
"""Labels on one run at most: enough to tag, not a document store (the list's GIN index holds them all)."""

MAX_NAME = 63
MAX_PREFIX = 253
NAME_PATTERN = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
PREFIX_PATTERN = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"
KEY_PATTERN = rf"^({PREFIX_PATTERN}/)?{NAME_PATTERN}$"
"""A key: an optional DNS-style prefix (lower-case letters, digits, `-` and `.`, at most 253 characters) and
`/`, then a name. One regular expression, stated in the API's document too, so a client can check it."""
VALUE_PATTERN = rf"^({NAME_PATTERN})?$"
_KEY = re.compile(KEY_PATTERN)
_VALUE = re.compile(VALUE_PATTERN)


def key_problem(key: str) -> str | None:
    """Why `key` is no label key (an optional DNS-style prefix and `/`, then a name), or None."""
    if _KEY.fullmatch(key):
        return None
    prefix, slash, _ = key.rpartition("/")
    if slash and not re.fullmatch(PREFIX_PATTERN, prefix):
        return "the key's prefix must be a DNS subdomain (lower-case letters, digits, '-' and '.', at most 253)"
    return ("the key's name must be 1 to 63 characters of letters, digits, '-', '_' or '.', starting and "
            "ending with a letter or digit")


def value_problem(value: str) -> str | None:
    """Why `value` is no label value (empty, or up to 63 characters of the name's charset), or None."""
    if not _VALUE.fullmatch(value):
        return ("the value must be empty or 1 to 63 characters of letters, digits, '-', '_' or '.', starting and "
                "ending with a letter or digit")
    return None


def labels_problems(labels: Mapping[str, object]) -> list[tuple[str, str]]:
    """Each bad label as (`labels.<key>`, why): the field names the label, as every field error does."""
    problems = []
    if len(labels) > MAX_LABELS:
        problems.append(("labels", f"at most {MAX_LABELS} labels"))
    for key, value in labels.items():
        if not isinstance(value, str):
            problems.append((f"labels.{key}", "the value must be a string"))
        elif (why := key_problem(key) or value_problem(value)) is not None:
            problems.append((f"labels.{key}", why))
    return problems


@dataclasses.dataclass(frozen=True)
class Selector:
    """A parsed label selector, as the store's query takes it: every requirement must hold.

    `equal`: key -> value the label must have; `not_equal`: (key, value) pairs it must not have (an absent
    key satisfies it, as in Kubernetes); `within` / `without`: (key, values) the label must be among (so
    present) / not among (absent is fine); `present` / `absent`: keys that must be there / must not."""

    equal: dict[str, str] = dataclasses.field(default_factory=dict)
    not_equal: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    within: list[tuple[str, list[str]]] = dataclasses.field(default_factory=list)
    without: list[tuple[str, list[str]]] = dataclasses.field(default_factory=list)
    present: list[str] = dataclasses.field(default_factory=list)
    absent: list[str] = dataclasses.field(default_factory=list)


_TOKEN = re.compile(r"\s*(!=|==|=|!|\(|\)|,|[^\s!=(),]+)")


def parse_selector(text: str) -> Selector:
    """Kubernetes' equality- and set-based selector: `team=billing,env!=prod,tier in (a,b),tier notin (c),
    key,!key` (`==` as `=`). Raises ValueError saying what is wrong, and where."""
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip() == "":
                break
            raise ValueError(f"cannot read {text[pos:]!r}")
        tokens.append(m.group(1))
        pos = m.end()
        if text[pos:].strip() == "":
            break
    selector = Selector()
    if not tokens:
        raise ValueError("is empty: give requirements such as team=billing,env!=prod")
    i = 0

    def take() -> str | None:
        nonlocal i
        if i >= len(tokens):
            return None
        i += 1
        return tokens[i - 1]

    def key_of(token: str | None) -> str:
        if token is None or token in ("!=", "==", "=", "!", "(", ")", ","):
            raise ValueError(f"expected a label key, found {token or 'the end'}")
        if (why := key_problem(token)) is not None:
            raise ValueError(f"{token!r}: {why}")
        return token

    def value_of(token: str | None, key: str) -> str:
        if token is None or token in ("!=", "==", "=", "!", "(", ")", ","):
            raise ValueError(f"expected a value for {key!r}, found {token or 'the end'}")
        if (why := value_problem(token)) is not None:
            raise ValueError(f"{token!r}: {why}")
        return token

    while True:
        token = take()
        if token == "!":
            selector.absent.append(key_of(take()))
        else:
            key = key_of(token)
            op = tokens[i] if i < len(tokens) else None
            if op in ("=", "==", "!="):
                i += 1
                # An empty value (`key=`) is a value: the label exists and is empty.
                nxt = tokens[i] if i < len(tokens) else None
                value = "" if nxt in (None, ",") else value_of(take(), key)
                if op == "!=":
                    selector.not_equal.append((key, value))
                elif key in selector.equal and selector.equal[key] != value:
                    selector.within.append((key, [value]))  # both must hold: no run matches
                else:
                    selector.equal[key] = value
            elif op in ("in", "notin"):
                i += 1
                if take() != "(":
                    raise ValueError(f"expected '(' after {key} {op}")
                values: list[str] = []
                while True:
                    values.append(value_of(take(), key))
                    sep = take()
                    if sep == ")":
                        break
                    if sep != ",":
                        raise ValueError(f"expected ',' or ')' in the values of {key} {op}, found {sep or 'the end'}")
                (selector.within if op == "in" else selector.without).append((key, values))
            elif op in (None, ","):
                selector.present.append(key)
            else:
                raise ValueError(f"expected =, ==, !=, in or notin after {key!r}, found {op!r}")
        sep = take()
        if sep is None:
            return selector
        if sep != ",":
            raise ValueError(f"expected ',' between requirements, found {sep!r}")
