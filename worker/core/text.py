"""Text as PostgreSQL can store it: a TEXT column rejects NUL (U+0000), and UTF-8 has no lone surrogates.

Tool outputs and model answers are untrusted and may contain either; one bad character must not make a
checkpoint fail (the run would be retried by every worker for ever). Pure, no I/O.
"""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"


def storable(text: str) -> tuple[str, int]:
    """The text with each NUL and lone surrogate replaced by U+FFFD, and how many were replaced."""
    replaced = text.count("\x00")
    if replaced:
        text = text.replace("\x00", REPLACEMENT)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Round-trip through UTF-16, which can carry surrogates: a split pair is joined again, a lone
        # surrogate becomes U+FFFD.
        fixed = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        replaced += fixed.count(REPLACEMENT) - text.count(REPLACEMENT)
        text = fixed
    return text, replaced


def clean(text: str) -> str:
    return storable(text)[0]


def clean_json(value: Any) -> Any:
    """Every string in a JSON value (keys too) made storable, so ids and names read back as written."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, list):
        return [clean_json(v) for v in value]
    if isinstance(value, dict):
        return {clean(k) if isinstance(k, str) else k: clean_json(v) for k, v in value.items()}
    return value


def unstorable(text: str | None) -> str | None:
    """Why `text` cannot be stored as it is (for refusing caller input with a clear message), or None."""
    if text is None:
        return None
    if "\x00" in text:
        return "contains a NUL character (U+0000), which PostgreSQL text cannot hold"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate, which is not valid Unicode text"
    return None
