"""The shipped price table prices each provider's models under the names runs carry."""

from __future__ import annotations

from decimal import Decimal

import pytest

from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.types import Usage

TABLE = PriceTable.load()


@pytest.mark.parametrize(("model", "priced_as"), [
    ("anthropic/claude-sonnet-4-6", "claude-sonnet-4-6"),
    ("anthropic/claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
    ("bedrock/anthropic.claude-sonnet-4-6", "bedrock/anthropic.claude-sonnet-4-6"),
    ("bedrock/anthropic.claude-sonnet-4-5-20250929-v1:0", "bedrock/anthropic.claude-sonnet-4-5"),
    ("bedrock/us.anthropic.claude-haiku-4-5-20251001-v1:0", "bedrock/anthropic.claude-haiku-4-5"),
    ("bedrock/global.anthropic.claude-opus-4-5-20251101-v1:0", "bedrock/anthropic.claude-opus-4-5"),
    ("vertex/claude-sonnet-4-6", "vertex/claude-sonnet-4-6"),
    ("vertex/claude-sonnet-4-5@20250929", "vertex/claude-sonnet-4-5"),
    ("openai/gpt-4.1-mini", "openai/gpt-4.1-mini"),
])
def test_each_provider_model_has_a_price(model: str, priced_as: str) -> None:
    assert TABLE.price(model) is not None and TABLE.price(model) == TABLE.prices[priced_as]


@pytest.mark.parametrize("model", [
    "vllm/meta-llama/Llama-3.1-8B-Instruct",  # served in the cluster: no list price
    "bedrock/meta.llama3-70b-instruct-v1:0",  # not a Claude model on Bedrock
    "openai/gpt-imaginary",
    "vertex/claude-sonnet-4-5@nightly",
])
def test_models_without_a_list_price_stay_unpriced(model: str) -> None:
    assert TABLE.price(model) is None


def test_openai_cached_input_is_priced_as_cache_reads() -> None:
    # gpt-4.1-mini: 0.40 input, 1.60 output, 0.10 cached input per million tokens
    usage = Usage(input_tokens=200, output_tokens=40, cache_read_input_tokens=1000)
    assert TABLE.cost("openai/gpt-4.1-mini", usage) == Decimal("0.000244")  # (200*0.4 + 40*1.6 + 1000*0.1) / 1e6
