"""Metric names in the chart's PromQL, and the series a /metrics page lets a query select, so the two can
be compared with what a live worker exposes."""

from __future__ import annotations

import re
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

_NAME = re.compile(r"\bagentrun_[a-zA-Z0-9_]*[a-zA-Z0-9]")

# The series each metric type puts on a /metrics page, by the suffix added to the family's name
# (prometheus-client's parser reports a counter family without its `_total`).
SERIES_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "gauge": ("",),
    "unknown": ("",),
}


def names_in_queries(queries: Iterable[str]) -> set[str]:
    """The agentrun series names PromQL expressions select, exactly as written (`_bucket`, `_total`...)."""
    return {name for query in queries for name in _NAME.findall(query)}


def series_in_exposition(text: str) -> set[str]:
    """Every series name a query can select on a Prometheus /metrics page.

    From the families' declared types, so a labelled counter or histogram that has no sample yet still
    counts (prometheus-client lists its family), and from the samples themselves.
    """
    names = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in SERIES_SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names
