"""The metric classes under the service's Prometheus stat logger: the same exposition as prometheus_client's own for
any sequence of writes, with the writes that change nothing never reaching the value store."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.values import MutexValue

from service.server.supervision.stat_logger import SkipSameGauge, SkipZeroCounter


def _exposition(registry: CollectorRegistry) -> list[str]:
    # `_created` holds each series' creation time, which differs between two registries built one after the other.
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def _pair(kind: str):
    plain, lean = CollectorRegistry(), CollectorRegistry()
    if kind == "counter":
        return (plain, lean), (
            Counter("c", "a counter", ["engine"], registry=plain),
            SkipZeroCounter("c", "a counter", ["engine"], registry=lean),
        )
    # vLLM's gauges are "mostrecent" (sets only); a gauge in the default mode also takes inc and dec.
    mode = "mostrecent" if kind == "mostrecent gauge" else "all"
    return (plain, lean), (
        Gauge("g", "a gauge", ["engine"], registry=plain, multiprocess_mode=mode),
        SkipSameGauge("g", "a gauge", ["engine"], registry=lean, multiprocess_mode=mode),
    )


COUNTER_WRITES = [("inc", 0), ("inc", 3), ("inc", 0), ("inc", 0.5), ("inc", 0), ("inc", 1)]
GAUGE_WRITES = [
    ("set", 1),
    ("set", 1),
    ("set", 0),
    ("set", 0),
    ("inc", 2),
    ("set", 0),
    ("set", 0.25),
    ("dec", 0.25),
    ("set", 0.25),
    ("set", 0.25),
    ("set", float("nan")),
    ("set", float("nan")),
    ("set", 3),
]


@pytest.mark.parametrize(
    ("kind", "writes"),
    [
        ("counter", COUNTER_WRITES),
        ("gauge", GAUGE_WRITES),
        ("mostrecent gauge", [write for write in GAUGE_WRITES if write[0] == "set"]),
    ],
)
def test_same_exposition_as_prometheus_client_after_every_write(kind, writes):
    (plain_registry, lean_registry), (plain, lean) = _pair(kind)
    for engine in ("0", "1"):
        for method, value in writes:
            getattr(plain.labels(engine), method)(value)
            getattr(lean.labels(engine), method)(value)
            assert _exposition(lean_registry) == _exposition(plain_registry), (method, value)


class _CountingValue:
    """Stands in for a child's value store, counting what reaches it."""

    def __init__(self, real):
        self.real, self.writes = real, 0

    def inc(self, amount):
        self.writes += 1
        self.real.inc(amount)

    def set(self, value, timestamp=None):
        self.writes += 1
        self.real.set(value)

    def get(self):
        return self.real.get()


def test_zero_increments_and_repeated_sets_skip_the_value_store():
    counter = SkipZeroCounter("c", "a counter", ["engine"], registry=CollectorRegistry()).labels("0")
    counter._value = _CountingValue(counter._value)
    for amount in (0, 0, 2, 0):
        counter.inc(amount)
    assert counter._value.writes == 1

    gauge = SkipSameGauge("g", "a gauge", ["engine"], registry=CollectorRegistry()).labels("0")
    store = gauge._value
    assert type(store) is MutexValue  # the single-process store, whose repeated sets are skipped
    written = []
    real_set = store.set
    store.set = lambda value, timestamp=None: (written.append(value), real_set(value))
    for value in (1, 1, 2, 2, 1):
        gauge.set(value)
    assert written == [1.0, 2.0, 1.0]
    assert gauge._value.get() == 1.0


def test_negative_counter_increment_still_refused():
    counter = SkipZeroCounter("c", "a counter", registry=CollectorRegistry())
    with pytest.raises(ValueError):
        counter.inc(-1)


def test_multiprocess_store_gets_every_set():
    """Under prometheus_client's multiprocess mode a "mostrecent" gauge records when each set happened."""
    gauge = SkipSameGauge("g", "a gauge", registry=CollectorRegistry(), multiprocess_mode="mostrecent")
    gauge._value = _CountingValue(gauge._value)
    for value in (1, 1, 1):
        gauge.set(value)
    assert gauge._value.writes == 3
