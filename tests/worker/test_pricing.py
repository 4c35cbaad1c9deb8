"""The price table: cost per step from configuration, null with a warning for an unknown model."""

from __future__ import annotations

import logging
from decimal import Decimal
from pathlib import Path

import pytest

from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.types import Usage
from agentrun.worker.settings import WorkerSettings

TABLE = """
[models."claude-test"]
input = 3.00
output = 15.00
cache_write = 3.75
cache_read = 0.30
"""


def test_cost_counts_every_kind_of_token_at_its_price() -> None:
    prices = PriceTable.from_toml(TABLE)

    cost = prices.cost("claude-test", Usage(1000, 2000, cache_creation_input_tokens=10_000, cache_read_input_tokens=100_000))

    # (1000*3 + 2000*15 + 10000*3.75 + 100000*0.30) / 1e6
    assert cost == Decimal("0.100500")


def test_zero_usage_costs_zero() -> None:
    assert PriceTable.from_toml(TABLE).cost("claude-test", Usage()) == 0


def test_dated_snapshots_and_latest_aliases_cost_what_their_family_costs() -> None:
    prices = PriceTable.from_toml(TABLE)
    assert prices.price("claude-test-20250929") == prices.price("claude-test")
    assert prices.price("claude-test-latest") == prices.price("claude-test")


def test_a_newer_model_is_not_priced_as_an_older_one() -> None:
    # "claude-test-5" is not a snapshot of "claude-test": a guessed price would be silently wrong.
    assert PriceTable.from_toml(TABLE).price("claude-test-5") is None


def test_an_unknown_model_costs_null_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    prices = PriceTable.from_toml(TABLE)

    with caplog.at_level(logging.WARNING, logger="agentrun.worker.core.pricing"):
        assert prices.cost("claude-imaginary", Usage(10, 10)) is None
        assert prices.cost("claude-imaginary", Usage(10, 10)) is None

    warnings = [r for r in caplog.records if "claude-imaginary" in r.getMessage()]
    assert len(warnings) == 1


def test_the_shipped_table_prices_the_default_model() -> None:
    prices = PriceTable.load()
    default = WorkerSettings(database_url="unused").default_model
    price = prices.price(default)
    assert price is not None, f"the default model {default} has no price in the shipped table"
    assert price.input > 0 and price.cache_read < price.input < price.cache_write
    assert prices.price(f"{default}-20250929") == price
    for model, p in prices.prices.items():
        # <=: OpenAI bills a cache write as plain input, with no surcharge
        assert p.cache_read < p.input <= p.cache_write < p.output, model


def test_a_file_overrides_the_shipped_table(tmp_path: Path) -> None:
    path = tmp_path / "prices.toml"
    path.write_text(TABLE)

    prices = PriceTable.load(path)

    assert set(prices.prices) == {"claude-test"}


@pytest.mark.parametrize(("text", "message"), [
    ('[models."m"]\ninput = 1\noutput = 1\ncache_write = 1\n', "model 'm' lacks 'cache_read'"),
    ('[models."m"]\ninput = "cheap"\noutput = 1\ncache_write = 1\ncache_read = 1\n', "input of model 'm' must be a number"),
    ('[models."m"]\ninput = -1\noutput = 1\ncache_write = 1\ncache_read = 1\n', "input of model 'm' must be a number >= 0"),
    ("models = 3\n", "must be a table"),
    ("[models\n", "line 1"),
])
def test_a_bad_table_is_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PriceTable.from_toml(text)
