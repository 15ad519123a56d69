"""vLLM's Prometheus stat logger, built on metric classes that skip the per-step writes which change nothing.

vLLM's API process records its Prometheus metrics once per engine step, which at one stream is once per token: about
ten counter increments and six gauge sets, and while decoding most are increments by zero (prompt tokens, prefix-cache
queries, preemptions) or sets to the value already there (running and waiting requests). vLLM builds these metrics
from `PrometheusStatLogger._counter_cls` / `_gauge_cls` (the extension point its Ray logger uses), and its
StatLoggerManager takes a PrometheusStatLogger subclass in place of its default one: the same metric names, labels,
help and values, scraped exactly as before; only the no-op writes are gone (docs/lab/performance.md).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge
from prometheus_client.values import MutexValue


class SkipZeroCounter(Counter):
    """A counter whose increments by zero return at once: the total they would leave is the total already there."""

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        if amount or exemplar:
            super().inc(amount, exemplar)


class SkipSameGauge(Gauge):
    """A gauge whose `set` to the value it last set returns at once. Any other write (inc, dec, a function) forgets
    that value. Under prometheus_client's multiprocess mode every set is written: there a "mostrecent" gauge (vLLM's
    are) records when it was set; in one process (the service's) it keeps the value alone."""

    _last_set: float | None = None

    def set(self, value: float) -> None:
        value = float(value)
        if value == self._last_set and type(self._value) is MutexValue:
            return
        super().set(value)
        self._last_set = value

    def inc(self, amount: float = 1) -> None:
        self._last_set = None
        super().inc(amount)

    def dec(self, amount: float = 1) -> None:
        self._last_set = None
        super().dec(amount)

    def set_function(self, f: Any) -> None:
        self._last_set = None
        super().set_function(f)


def prometheus_stat_logger() -> type:
    """vLLM's PrometheusStatLogger on the classes above, for AsyncLLM's `stat_loggers`. Imported late: vLLM's
    metrics module pulls in the engine."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    class LeanPrometheusStatLogger(PrometheusStatLogger):
        _counter_cls = SkipZeroCounter
        _gauge_cls = SkipSameGauge

    return LeanPrometheusStatLogger
