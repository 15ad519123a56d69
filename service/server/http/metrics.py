"""The service's own Prometheus metrics, on the registry vLLM exports its `vllm:*` metrics from.

Label values come only from the startup report (a fixed, small set): never prompts or request ids.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Info
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from service.server.http.redact import without_paths
from service.startup.report import StartupReport

__all__ = ["ServiceMetrics", "CONTENT_TYPE_LATEST"]


def _label(value: object) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))


class ServiceMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.info = Info("service", "Service build, backend and hardware", registry=registry)
        self.decision = Gauge(
            "service_decision_info",
            "Engine settings the startup policy decided (value and source as labels)",
            ["setting", "value", "source"],
            registry=registry,
        )
        self.startup_seconds = Gauge(
            "service_startup_seconds", "Seconds from process start until the service was ready", registry=registry
        )
        self.ready = Gauge("service_ready", "1 while the service accepts requests", registry=registry)
        self.in_flight = Gauge(
            "service_in_flight_requests", "Requests being served by the front end", registry=registry
        )
        self.lora_adapters = Gauge(
            "service_lora_adapters",
            "LoRA adapters requests may name: those set at start and those loaded while serving",
            registry=registry,
        )
        self.slow_clients = Counter(
            "service_slow_connections_closed",
            "Connections closed because their request head did not arrive in time (silent or slowloris clients)",
            registry=registry,
        )

    def describe_startup(self, report: StartupReport, served_model: str) -> None:
        sw, hw = report.software, report.hardware
        self.info.info(
            {
                "backend": _label(report.plan.backend.name),
                "backend_reason": without_paths(report.plan.backend.reason)[:200],
                "platform": _label(report.plan.backend.platform),
                "vendor": hw.cpu.vendor,
                "microarchitecture": hw.cpu.microarchitecture,
                "model": without_paths(served_model),
                "service_version": _label(sw.service),
                "vllm_version": _label(sw.vllm),
                "torch_version": _label(sw.torch),
                "zentorch_version": _label(sw.zentorch),
            }
        )
        for d in report.decisions:
            value = d.value if isinstance(d.value, str) else repr(d.value)
            # No paths: /metrics is open unless metrics_require_auth (cache, model and adapter paths are values).
            self.decision.labels(setting=d.setting, value=without_paths(value)[:200], source=d.source).set(1)

    def prefix_cache(self) -> dict[str, float | None]:
        """The engine's prefix cache since start, from vLLM's counters: tokens looked up, tokens found, their ratio."""
        totals = {"vllm:prefix_cache_queries": 0.0, "vllm:prefix_cache_hits": 0.0}
        for family in self.registry.collect():
            if family.name in totals:
                totals[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
        queries, hits = totals["vllm:prefix_cache_queries"], totals["vllm:prefix_cache_hits"]
        return {"queried_tokens": queries, "hit_tokens": hits, "hit_rate": hits / queries if queries else None}

    def render(self) -> bytes:
        return generate_latest(self.registry)
