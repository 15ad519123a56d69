"""The model table's own metrics, and every engine's /metrics under a `model` label: one scrape of the service
reads all its engines, each series saying which model it is of."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

STATES = ("unloaded", "loading", "loaded", "stopping")


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._state = Gauge(
            "service_model_state",
            "1 for the state each listed model's engine is in",
            ["model", "state"],
            registry=self.registry,
        )
        self._loads = Counter(
            "service_model_loads", "Engine loads that became ready", ["model"], registry=self.registry
        )
        self._unloads = Counter(
            "service_model_unloads",
            "Engines stopped or ended, by why: evicted, idle, admin, shutdown, died, failed (to start)",
            ["model", "reason"],
            registry=self.registry,
        )
        self._load_seconds = Gauge(
            "service_model_load_seconds",
            "Seconds the last load took, start to ready",
            ["model"],
            registry=self.registry,
        )
        self._in_flight = Gauge(
            "service_model_requests_in_flight",
            "Requests being relayed to each engine",
            ["model"],
            registry=self.registry,
        )

    def state(self, model: str, state: str) -> None:
        for each in STATES:
            self._state.labels(model, each).set(1 if each == state else 0)

    def loaded(self, model: str, seconds: float) -> None:
        self._loads.labels(model).inc()
        self._load_seconds.labels(model).set(seconds)

    def unloaded(self, model: str, reason: str) -> None:
        self._unloads.labels(model, reason).inc()

    def in_flight(self, model: str, count: int) -> None:
        self._in_flight.labels(model).set(count)

    def render(self, engines: Mapping[str, str]) -> bytes:
        """The router's metrics, then each engine's (`engines`: model -> its /metrics text) labelled by model."""
        merged = CollectorRegistry()
        merged.register(_Labelled(engines))
        return generate_latest(self.registry) + generate_latest(merged)


class _Labelled:
    def __init__(self, engines: Mapping[str, str]) -> None:
        self._engines = engines

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        for model, text in self._engines.items():
            for family in text_string_to_metric_families(text):
                merged = families.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type, family.unit)
                )
                merged.samples.extend(
                    Sample(s.name, {**s.labels, "model": model}, s.value, s.timestamp, s.exemplar)
                    for s in family.samples
                )
        return families.values()
