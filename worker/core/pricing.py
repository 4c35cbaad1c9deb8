"""Cost of a model step in USD, from a price table read from configuration (never from constants)."""

from __future__ import annotations

import dataclasses
import importlib.resources
import logging
import re
import tomllib
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path

from agentrun.worker.core.types import Usage

log = logging.getLogger(__name__)

MILLION = Decimal(1_000_000)
SNAPSHOT = re.compile(r"(.+)-(?:\d{8}|latest)")
# Bedrock ids: an optional cross-region inference profile ("us.", "eu.", "global."...), the vendor, the
# model, and a version suffix ("-v1:0"); Vertex ids: the model and an optional "@20250929" snapshot.
BEDROCK_ID = re.compile(r"bedrock/(?:[a-z-]{2,8}\.)?(anthropic\.[^:]+?)(?:-v\d+(?::\d+)?)?")
VERTEX_ID = re.compile(r"vertex/([^@]+)@(?:\d{8}|latest)")


@dataclasses.dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: Decimal
    output: Decimal
    cache_write: Decimal
    cache_read: Decimal


@dataclasses.dataclass(frozen=True)
class Limits:
    """A model's limits, in tokens: a request fits when its input plus its `max_tokens` is within the window."""

    context_window: int
    max_output_tokens: int
    server_compaction: bool = False
    """The provider compacts this model's conversations itself (the Messages API's compaction beta): what
    contextManagement `auto` uses for it, rather than the engine's own summaries."""


MAX_LIMIT = 100_000_000


class PriceTable:
    def __init__(self, prices: Mapping[str, Price], limits: Mapping[str, Limits] | None = None) -> None:
        self.prices = dict(prices)
        self.windows = dict(limits or {})
        self._warned: set[str] = set()

    @classmethod
    def from_toml(cls, text: str) -> PriceTable:
        """Prices from TOML; ValueError naming the model and field if one is missing or not a price."""
        data = tomllib.loads(text)  # tomllib.TOMLDecodeError is a ValueError
        models = data.get("models", {})
        if not isinstance(models, dict):
            raise ValueError("price table: [models] must be a table of models")
        prices, limits = {}, {}
        for model, p in models.items():
            values = []
            for field in ("input", "output", "cache_write", "cache_read"):
                if not isinstance(p, dict) or field not in p:
                    raise ValueError(f"price table: model {model!r} lacks {field!r}")
                try:
                    value = Decimal(str(p[field]))
                except InvalidOperation:
                    value = Decimal(-1)
                if not value.is_finite() or value < 0:
                    raise ValueError(f"price table: {field} of model {model!r} must be a number >= 0, got {p[field]!r}")
                values.append(value)
            prices[model] = Price(*values)
            window, output = p.get("context_window"), p.get("max_output_tokens")
            for field, number in (("context_window", window), ("max_output_tokens", output)):
                if number is not None and (not isinstance(number, int) or isinstance(number, bool)
                                           or not 1 <= number <= MAX_LIMIT):
                    raise ValueError(f"price table: {field} of model {model!r} must be an integer from 1 to "
                                     f"{MAX_LIMIT}, got {number!r}")
            if (window is None) != (output is None):
                raise ValueError(f"price table: model {model!r} names one of context_window and max_output_tokens "
                                 "without the other")
            if window is not None and output is not None:
                if output >= window:
                    raise ValueError(f"price table: max_output_tokens of model {model!r} ({output}) must be below "
                                     f"its context_window ({window})")
                compacts = p.get("server_compaction", False)
                if not isinstance(compacts, bool):
                    raise ValueError(f"price table: server_compaction of model {model!r} must be true or false, "
                                     f"got {compacts!r}")
                limits[model] = Limits(window, output, compacts)
        return cls(prices, limits)

    @classmethod
    def load(cls, path: str | Path | None = None) -> PriceTable:
        """The file at `path` (AGENTRUN_PRICES_FILE), else the table shipped with the package."""
        if path:
            return cls.from_toml(Path(path).read_text(encoding="utf-8"))
        return cls.from_toml(importlib.resources.files("agentrun.worker").joinpath("prices.toml").read_text())

    def price(self, model: str) -> Price | None:
        for name in _names(model):
            if name in self.prices:
                return self.prices[name]
        return None

    def limits(self, model: str) -> Limits | None:
        """The model's window and output limit, found under the same names as its price; None if unknown."""
        for name in _names(model):
            if name in self.windows:
                return self.windows[name]
        return None

    def cost(self, model: str, usage: Usage) -> Decimal | None:
        p = self.price(model)
        if p is None:
            if model not in self._warned:
                self._warned.add(model)
                log.warning("no price for model %s: its cost is recorded as null", model)
            return None
        total = (
            usage.input_tokens * p.input
            + usage.output_tokens * p.output
            + usage.cache_creation_input_tokens * p.cache_write
            + usage.cache_read_input_tokens * p.cache_read
        )
        return (total / MILLION).quantize(Decimal("0.000001"))


def cost_budget_problem(prices: PriceTable, model: str, cost_budget: Decimal | None) -> str | None:
    """Why a run's cost budget could not be enforced (its model has no price), or None if it can be.

    A step of an unpriced model costs null, so a budget on it would never stop the run: refused up front.
    """
    if cost_budget is None or prices.price(model) is not None:
        return None
    return (
        f"costBudgetUsd cannot be enforced: model {model!r} has no price in the price table "
        "(add it to AGENTRUN_PRICES_FILE, or drop the cost budget)"
    )


def _names(model: str) -> list[str]:
    """The price-table names `model` may be listed under, most specific first.

    A dated snapshot ("claude-sonnet-4-5-20250929") or alias ("claude-3-5-haiku-latest") costs what its
    family costs; "anthropic/<model>" what "<model>" costs; a Bedrock id what its model costs without
    inference profile and version ("bedrock/us.anthropic.claude-sonnet-4-5-20250929-v1:0" is priced as
    "bedrock/anthropic.claude-sonnet-4-5"); a Vertex snapshot what its model costs. Nothing looser:
    "claude-sonnet-4-6" is a new model, not a "claude-sonnet-4", and a guessed price would be wrong
    silently where null is flagged.
    """
    names = [model]
    if model.startswith("anthropic/"):
        names.append(model.removeprefix("anthropic/"))
    if bedrock := BEDROCK_ID.fullmatch(model):
        names.append(f"bedrock/{bedrock.group(1)}")
    if vertex := VERTEX_ID.fullmatch(model):
        names.append(f"vertex/{vertex.group(1)}")
    for name in list(names):
        if family := SNAPSHOT.fullmatch(name):
            names.append(family.group(1))
    return list(dict.fromkeys(names))
