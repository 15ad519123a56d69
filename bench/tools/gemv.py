"""Batch-1 bf16 linear kernels of the live backend, side by side, against the read bandwidth of the same moment.

  .venv/bin/python -m bench.tools.gemv [--rounds 40] [--cpu 0] [--json PATH]

Why: a batch-1 decode step of a bandwidth-bound model is mostly GEMVs (M = 1). This separates the kernels' own
efficiency from the engine's per-step costs, which the decode profile (`python -m bench --decode --profile`) shows.

One process pinned to one CPU with one thread (the engine's compute threads on the build machines), the bench
model's linear layers in vLLM's fused shapes (q/k/v, o, gate/up, down; 11 layers, ~1 GB of bf16 per kernel, far
more than the last-level cache), one copy per kernel in the layout that kernel reads. Each round reads a 2 GiB
array (torch.sum, as bench/bandwidth.py) and then runs every kernel over all layers once, in an order that rotates
per round. A kernel's fraction of the ceiling = its GB/s over that round's read bandwidth: the host's memory
bandwidth moved by x1.7 within minutes on a Zen 5 guest (40 -> 23 GB/s), so only figures of the same round are
compared, with a 95% t-interval over rounds (bench/stats.py).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.stats import Estimate, estimate

# vLLM's fused linear shapes of harness/models.py's Llama: (N, K) per layer.
SHAPES = ((3072, 2048), (2048, 2048), (11264, 2048), (2048, 5632))
LAYERS = 11


@dataclass(frozen=True)
class Kernel:
    name: str
    route: str  # what sends vLLM 0.32's unquantized bf16 linear layers to this kernel on the live backend


def kernels(backend: str) -> tuple[Kernel, ...]:
    """The bf16 GEMV kernels a setting of this service can route vLLM to on `backend`; the first is its default
    (vllm/model_executor/layers/utils.py: dispatch_cpu_unquantized_gemm)."""
    onednn = Kernel("onednn_mm", "vLLM's CpuPlatform dispatch (AVX-512 BF16 / AMX brgemm)")
    if backend == "zen":
        return (
            Kernel("zentorch prepacked", "ZenCpuPlatform, VLLM_ZENTORCH_WEIGHT_PREPACK=1 (default)"),
            Kernel("zentorch", "ZenCpuPlatform, VLLM_ZENTORCH_WEIGHT_PREPACK=0 (SERVICE_ZENTORCH_WEIGHT_PREPACK)"),
            Kernel("onednn_mm", "CpuPlatform (SERVICE_BACKEND=avx512)"),
        )
    # AMX's sgl weight_packed_linear takes only weights under 1 MiB (router-sized: check_cpu_sgl_kernel), none of these.
    return (onednn,)


def _runner(kernel: str, weights: Sequence[Any], xs: Mapping[int, Any]) -> Callable[[], None]:
    """A pass over all layers with `kernel`, called as vLLM calls it."""
    import torch

    if kernel.startswith("zentorch"):
        import zentorch  # noqa: F401  (registers torch.ops.zentorch)

        packed = kernel == "zentorch prepacked"
        zen = torch.ops.zentorch
        ws = [(zen.zentorch_weight_prepack_for_linear(w) if packed else w, w.shape[1]) for w in weights]

        def zentorch_pass() -> None:
            for w, k in ws:
                zen.zentorch_linear_unary(xs[k], w, None, is_weight_prepacked=packed)

        return zentorch_pass
    from vllm import _custom_ops as ops

    handles = [(ops.create_onednn_mm(w.t(), 32), w.shape[1]) for w in weights]

    def onednn_pass() -> None:
        for h, k in handles:
            ops.onednn_mm(h, xs[k], None)

    return onednn_pass


def measure(backend: str, rounds: int, cpu: int) -> dict[str, Any]:
    os.sched_setaffinity(0, [cpu])
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    chosen = kernels(backend)
    xs = {k: torch.randn(1, k).to(torch.bfloat16) for _, k in SHAPES}
    runs: dict[str, Callable[[], None]] = {}
    nbytes = LAYERS * sum(n * k * 2 for n, k in SHAPES)
    for kern in chosen:
        weights = [torch.randn(n, k).to(torch.bfloat16) for _ in range(LAYERS) for n, k in SHAPES]
        runs[kern.name] = _runner(kern.name, weights, xs)
        runs[kern.name]()  # first call: JIT and caches, untimed
    probe = torch.ones(2 * 1024**3 // 4, dtype=torch.float32)
    out: list[dict[str, Any]] = []
    names = [k.name for k in chosen]
    for r in range(rounds):
        t = time.perf_counter()
        probe.sum()
        bandwidth = probe.numel() * 4 / (time.perf_counter() - t) / 1e9
        gbs = {}
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t = time.perf_counter()
            runs[name]()
            gbs[name] = nbytes / (time.perf_counter() - t) / 1e9
        out.append({"bandwidth_gbs": bandwidth, "gbs": gbs})
    return {
        "backend": backend,
        "cpu": cpu,
        "bytes_per_pass": nbytes,
        "kernels": [k.__dict__ for k in chosen],
        "rounds": out,
    }


def summarize(rounds: Sequence[Mapping[str, Any]], default: str) -> dict[str, dict[str, Estimate]]:
    """Per kernel: its fraction of the same round's read bandwidth, and its speed against the default kernel's in
    the same round (ratios, 95% t-intervals over rounds)."""
    names = list(rounds[0]["gbs"])
    fraction = {n: estimate("fraction", "ratio", [r["gbs"][n] / r["bandwidth_gbs"] for r in rounds]) for n in names}
    versus = {n: estimate("vs default", "ratio", [r["gbs"][n] / r["gbs"][default] for r in rounds]) for n in names}
    return {"fraction_of_read_bandwidth": fraction, "vs_default": versus}


def table(result: Mapping[str, Any]) -> str:
    kern = result["kernels"]
    s = summarize(result["rounds"], kern[0]["name"])
    bw = sorted(r["bandwidth_gbs"] for r in result["rounds"])
    lines = [
        f"backend {result['backend']}, CPU {result['cpu']}, one thread, {result['bytes_per_pass'] / 1e9:.2f} GB per "
        f"pass, {len(result['rounds'])} rounds; read bandwidth {bw[0]:.1f}-{bw[-1]:.1f} GB/s",
        "| kernel | route | fraction of the round's read bandwidth | speed vs the default |",
        "| --- | --- | --- | --- |",
    ]
    for k in kern:
        f, v = s["fraction_of_read_bandwidth"][k["name"]], s["vs_default"][k["name"]]
        share = f"{f.value:.0%}" + (f" [{f.low:.0%}, {f.high:.0%}]" if f.low is not None and f.high is not None else "")
        lines.append(f"| {k['name']} | {k['route']} | {share} | {v.fmt()} |")
    return "\n".join(lines)


def main() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"  # before torch (and OpenMP) start: one compute thread, as the engine's
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--cpu", type=int, default=0)
    p.add_argument("--backend", help="default: the service's choice for this machine")
    p.add_argument("--json", help="write the rounds here")
    args = p.parse_args()
    backend = args.backend
    if backend is None:
        from service.facts.hardware import read_hardware
        from service.facts.software import read_software
        from service.policy.machine.backend import choose_backend

        backend = choose_backend(read_hardware().cpu, read_software()).name or "none"
    result = measure(backend, args.rounds, args.cpu)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(table(result))


if __name__ == "__main__":
    main()
