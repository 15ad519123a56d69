"""bench/load.py: the load generator's CPUs, workloads, and what it measures around the requests."""

from __future__ import annotations

from bench.load import Workload, client_cpus, requests_window


def test_client_cpus_of_its_own_or_shared_and_said_so():
    own = client_cpus([0, 1, 2, 3], engine=[0, 1], reserved=[2])
    assert own.cpus == (3,) and own.own and "of its own" in own.note
    shared = client_cpus([0, 1], engine=[0], reserved=[1])
    assert shared.cpus == (1,) and not shared.own
    assert "SHARES CPU(s) [1] with the API servers" in shared.note and "2 CPU(s)" in shared.note


def test_workload_arguments_fix_the_lengths_and_ignore_eos():
    argv = Workload(4, 16, 128, 64, seed=3).argv("http://127.0.0.1:1", "/m", "demo")
    opts = dict(zip(argv[::1], argv[1:] + [""]))
    assert opts["--random-input-len"] == "128" and opts["--random-output-len"] == "64"
    assert opts["--random-range-ratio"] == "0" and opts["--max-concurrency"] == "4"
    assert opts["--num-prompts"] == "16" and opts["--seed"] == "3" and opts["--dataset-name"] == "random"
    assert "--ignore-eos" in argv and opts["--metric-percentiles"] == "50,99"
    assert "--header" not in argv


def test_a_peer_workload_asks_for_a_connection_per_request():
    from bench.load import client_args

    argv = Workload(16, 32, 128, 32, seed=3, fresh_connections=True).argv("http://127.0.0.1:1", "/m", "demo")
    assert client_args(argv).header == ["Connection=close"]


def test_api_cpu_is_sampled_around_the_requests_not_the_client_s_metrics_scrapes():
    import asyncio
    import inspect

    from vllm.benchmarks import serve

    # The anchor: vLLM's client fetches these counters once right before its requests and once right after.
    body = inspect.getsource(serve.benchmark)
    assert body.count("await fetch_spec_decode_metrics(") == 2
    assert body.count("await fetch_diffusion_metrics(") == 2
    before = serve.fetch_spec_decode_metrics, serve.fetch_diffusion_metrics
    readings = iter([1.25, 1.5])
    with requests_window(lambda: next(readings)) as marks:
        assert asyncio.run(serve.fetch_spec_decode_metrics("http://unused", None)) is None
        assert asyncio.run(serve.fetch_diffusion_metrics("http://unused", None)) is None
        assert asyncio.run(serve.fetch_spec_decode_metrics("http://unused", None)) is None
    assert marks == [1.25, 1.5]
    assert (serve.fetch_spec_decode_metrics, serve.fetch_diffusion_metrics) == before
