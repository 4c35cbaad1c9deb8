"""Cost of a model step in USD, from a price table read from configuration (never from constants)."""

from __future__ import annotations

import dataclasses
import importlib.resources
import logging
import tomllib
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path

from agentrun.worker.llm.types import Usage

log = logging.getLogger(__name__)

MILLION = Decimal(1_000_000)


@dataclasses.dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: Decimal
    output: Decimal
    cache_write: Decimal
    cache_read: Decimal


class PriceTable:
    def __init__(self, prices: Mapping[str, Price]) -> None:
        self.prices = dict(prices)
        self._warned: set[str] = set()

    @classmethod
    def from_toml(cls, text: str) -> PriceTable:
        data = tomllib.loads(text)
        prices = {}
        for model, p in data.get("models", {}).items():
            try:
                prices[model] = Price(*(Decimal(str(p[k])) for k in ("input", "output", "cache_write", "cache_read")))
            except KeyError as e:
                raise ValueError(f"price table: model {model!r} lacks {e.args[0]!r}") from None
        return cls(prices)

    @classmethod
    def load(cls, path: str | Path | None = None) -> PriceTable:
        """The file at `path` (AGENTRUN_PRICES_FILE), else the table shipped with the package."""
        if path:
            return cls.from_toml(Path(path).read_text(encoding="utf-8"))
        return cls.from_toml(importlib.resources.files("agentrun.worker").joinpath("prices.toml").read_text())

    def price(self, model: str) -> Price | None:
        if model in self.prices:
            return self.prices[model]
        # Dated snapshots ("claude-sonnet-4-5-20250929") cost what their family costs.
        family = max((m for m in self.prices if model.startswith(m + "-")), key=len, default=None)
        return self.prices[family] if family else None

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
