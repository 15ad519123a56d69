"""bench/tools/gemv.py's pure parts: which kernels each backend can be routed to, and per-round fractions."""

from __future__ import annotations

import pytest

from bench.tools import gemv


def test_the_first_kernel_of_each_backend_is_vllms_default_there():
    assert gemv.kernels("zen")[0].name == "zentorch prepacked"
    assert [k.name for k in gemv.kernels("zen")][1:] == ["zentorch", "onednn_mm"]
    assert gemv.kernels("avx512")[0].name == gemv.kernels("amx")[0].name == "onednn_mm"
    assert all(k.route for b in ("zen", "amx", "avx512", "avx2") for k in gemv.kernels(b))


def test_fractions_divide_by_the_same_rounds_bandwidth():
    # The host's bandwidth halves between rounds; each kernel's fraction stays put, so its interval is tight.
    rounds = [
        {"bandwidth_gbs": 40.0, "gbs": {"a": 36.0, "b": 32.0}},
        {"bandwidth_gbs": 20.0, "gbs": {"a": 18.0, "b": 16.0}},
        {"bandwidth_gbs": 30.0, "gbs": {"a": 27.0, "b": 24.0}},
    ]
    s = gemv.summarize(rounds, "a")
    a, b = s["fraction_of_read_bandwidth"]["a"], s["fraction_of_read_bandwidth"]["b"]
    assert a.value == pytest.approx(0.9) and a.low == pytest.approx(0.9) and a.high == pytest.approx(0.9)
    assert b.value == pytest.approx(0.8)
    assert s["vs_default"]["b"].value == pytest.approx(8 / 9) and s["vs_default"]["a"].value == pytest.approx(1.0)


def test_table_names_every_kernel_with_its_route():
    result = {
        "backend": "zen",
        "cpu": 0,
        "bytes_per_pass": 991952896,
        "kernels": [k.__dict__ for k in gemv.kernels("zen")],
        "rounds": [
            {"bandwidth_gbs": bw, "gbs": {"zentorch prepacked": 0.9 * bw, "zentorch": 0.88 * bw, "onednn_mm": 0.8 * bw}}
            for bw in (40.0, 25.0)
        ],
    }
    text = gemv.table(result)
    assert "read bandwidth 25.0-40.0 GB/s" in text
    assert (
        "| zentorch prepacked | ZenCpuPlatform, VLLM_ZENTORCH_WEIGHT_PREPACK=1 (default) | 90% [90%, 90%] | x1.000"
        in text
    )
    assert "| onednn_mm | CpuPlatform (SERVICE_BACKEND=avx512) | 80% [80%, 80%] | x0.889" in text
