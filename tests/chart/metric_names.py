"""The metric names the chart's dashboard and alerts rely on, and ways to read names from queries,
from a /metrics page and from a prometheus-client registry, so they can be checked against the worker."""

from __future__ import annotations

import re
from collections.abc import Iterable

from agentrun.worker.metrics import METRIC_NAMES

# Every series the dashboard and the PrometheusRule query: exactly what the worker exports. A test checks
# the dashboard and rules use nothing else, and each of them somewhere.
CHART_METRICS = frozenset(METRIC_NAMES)

# Series a histogram exposes besides its name; queries name these, the code names the histogram.
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
_NAME = re.compile(r"\bagentrun_[a-zA-Z0-9_]*[a-zA-Z0-9]")


def names_in_queries(queries: Iterable[str], histograms: Iterable[str] = CHART_METRICS) -> set[str]:
    """Metric names in PromQL expressions, with histogram series folded onto their histogram."""
    known = set(histograms)
    names = set()
    for query in queries:
        for name in _NAME.findall(query):
            for suffix in HISTOGRAM_SUFFIXES:
                if name.endswith(suffix) and name[: -len(suffix)] in known:
                    name = name[: -len(suffix)]
                    break
            names.add(name)
    return names


def names_in_exposition(text: str) -> set[str]:
    """Metric family names on a Prometheus /metrics page (from its # TYPE lines; counters keep `_total`)."""
    names = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[:2] == ["#", "TYPE"]:
            name, kind = parts[2], parts[3]
            names.add(name + "_total" if kind == "counter" and not name.endswith("_total") else name)
    return names


def names_in_registry(registry: object) -> set[str]:
    """Metric family names a prometheus-client registry would expose, named as in the text format."""
    from prometheus_client import generate_latest

    return names_in_exposition(generate_latest(registry).decode())  # type: ignore[arg-type]
