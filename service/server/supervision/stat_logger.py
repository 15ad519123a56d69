"""vLLM's Prometheus stat logger, built on metric classes that skip the per-step writes which change nothing.

vLLM's API process records its Prometheus metrics once per engine step, which at one stream is once per token: about
ten counter increments and six gauge sets, and while decoding most are increments by zero (prompt tokens, prefix-cache
queries, preemptions) or sets to the value already there (running and waiting requests). vLLM builds these metrics
from `PrometheusStatLogger._counter_cls` / `_gauge_cls` (the extension point its Ray logger uses), and its
StatLoggerManager takes a PrometheusStatLogger subclass in place of its default one: the same metric names, labels,
help and values, scraped exactly as before; only the no-op writes are gone (measured with the environment cache:
claim/stat-logger-api-cpu/zen5 in service/measurements/).

It adds one histogram vLLM lacks: the prompt tokens each request found in the prefix cache. vLLM's per-request
histograms give the prompt's tokens, those computed in prefill, the prefill and decode times; what an agent session
saves by re-sending its conversation is the cached share of each request, which their totals cannot give.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client.values import MutexValue

CACHED_TOKENS = "service_request_prompt_cached_tokens"


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
    from vllm.v1.metrics.buckets import histogram_buckets
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    class LeanPrometheusStatLogger(PrometheusStatLogger):
        _counter_cls = SkipZeroCounter
        _gauge_cls = SkipSameGauge

        def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:
            super().__init__(vllm_config, engine_indexes)
            _unregister(CACHED_TOKENS)  # as vLLM drops its own at each construction: one engine per process
            buckets = histogram_buckets("request_tokens", max_model_len=vllm_config.model_config.max_model_len)
            cached = self._histogram_cls(
                name=CACHED_TOKENS,
                documentation="Prompt tokens of each finished request that were found in the prefix cache",
                buckets=buckets,
                labelnames=["model_name", "engine"],
            )
            self.histogram_cached_tokens = {
                idx: cached.labels(*values) for idx, values in self.per_engine_labelvalues.items()
            }

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            super().record(scheduler_stats, iteration_stats, mm_cache_stats, engine_idx)
            if iteration_stats is not None:
                for finished in iteration_stats.finished_requests:
                    self.histogram_cached_tokens[engine_idx].observe(max(finished.num_cached_tokens, 0))

    return LeanPrometheusStatLogger


def _unregister(name: str) -> None:
    collector = REGISTRY._names_to_collectors.get(name)  # noqa: SLF001 (prometheus_client has no lookup by name)
    if collector is not None:
        REGISTRY.unregister(collector)
