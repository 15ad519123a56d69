"""A server's Prometheus counters as numbers, read the way Prometheus reads them (prometheus_client's parser, which
vLLM already installs): the tests and the bench compare them before and after a load."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def counter_totals(url: str, prefix: str) -> dict[str, float]:
    """Every counter at `url`/metrics whose name starts with `prefix`: its `_total` sample summed over its labels."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        for sample in family.samples:
            if sample.name.startswith(prefix) and sample.name.endswith("_total"):
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals
