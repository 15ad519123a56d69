"""Top-p masking: vLLM 0.32's sort of the vocabulary against the service's nucleus from the top tokens
(service/in_vllm/top_p.py), the measurement `top_p_mask=partial` rests on (service/policy/engine/top_p.py).

  .venv/bin/python -m bench.tools.top_p [--rounds 20] [--repetitions 3] [--requests 4] [--no-served]

The op alone: one thread pinned to one CPU, logits of the default model's vocabulary (49 152) and of Qwen's
(151 936), a batch of 1 and of 4, top_p 0.9 alone and top_k 20 with top_p 0.8 (Qwen's generation config), both
functions per round in alternating order; ms per call (median over rounds) and the ratio with its 95% interval.
The logits are Gaussian at a scale whose nucleus is tens to hundreds of tokens (it prints how many).
Served: the default model twice side by side (bench/paired.py), with `SERVICE_TOP_P_MASK=sort` and with the policy's
choice, batch-1 decode rates of requests at temperature 0.7, top_p 0.9.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench.stats import estimate
from harness import REPO

VOCABS = {"SmolLM2": 49152, "Qwen2.5": 151936}
CASES = {"top_p 0.9": (None, 0.9), "top_k 20, top_p 0.8": (20, 0.8)}
SAMPLING = {"temperature": 0.7, "top_p": 0.9}
SCALE = 5.0  # Gaussian logits at this scale: a nucleus of 0.9 holds tens to hundreds of tokens (printed)


def op_alone(rounds: int, cpu: int = 0) -> dict[str, Any]:
    import torch

    from service.in_vllm.top_p import _vllm_sort, top_k_top_p

    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    out: dict[str, Any] = {}
    for vocab_name, vocab in VOCABS.items():
        for batch in (1, 4):
            logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(vocab + batch)) * SCALE
            for case, (k, p) in CASES.items():
                ks = None if k is None else torch.full((batch,), k)
                ps = torch.full((batch,), p)
                funcs = {
                    "sort": lambda x=logits, k=ks, p=ps: _vllm_sort(x.clone(), k, p),
                    "partial": lambda x=logits, k=ks, p=ps: top_k_top_p(x.clone(), k, p),
                }
                kept = funcs["sort"]() > float("-inf")
                same = torch.equal(kept, funcs["partial"]() > float("-inf"))
                nucleus = int(kept.sum(dim=-1).max())
                ms: dict[str, list[float]] = {name: [] for name in funcs}
                for r in range(rounds):
                    for name in funcs if r % 2 == 0 else list(funcs)[::-1]:
                        start = time.perf_counter()
                        for _ in range(5):
                            funcs[name]()
                        ms[name].append((time.perf_counter() - start) / 5 * 1e3)
                key = f"{vocab_name} ({vocab}), batch {batch}, {case}"
                ratio = estimate(key, "ratio", [a / b for a, b in zip(ms["partial"], ms["sort"])])
                out[key] = {
                    "sort_ms": statistics.median(ms["sort"]),
                    "partial_ms": statistics.median(ms["partial"]),
                    "partial_vs_sort": ratio.fmt(),
                    "interval": [ratio.value, ratio.low, ratio.high],
                    "same_tokens": same,
                    "nucleus": nucleus,
                }
                print(
                    f"{key}: sort {out[key]['sort_ms']:.3f} ms, partial {out[key]['partial_ms']:.3f} ms; "
                    f"{ratio.fmt()}; {nucleus} tokens kept (at most, per row), the same: {same}"
                )
    return out


def served(repetitions: int, requests: int, out: Path) -> dict[str, Any]:
    from bench import paired
    from service.facts.model import packaged_default_model_path
    from service.settings import default_cache_dir

    model = packaged_default_model_path()
    assert model, "no model: the default model's wheel is not installed"
    run = paired.Run(
        model, default_cache_dir(), out / "logs", repetitions, requests, 128, {"kv_cache_gib": "1"}, SAMPLING
    )
    result = paired.measure({"partial": {}, "sort": {"SERVICE_TOP_P_MASK": "sort"}}, run)
    e = estimate("decode partial/sort", "ratio", result["ratios"])
    print(f"served, temperature 0.7 top_p 0.9: {paired.summary(result | {'estimate': e.fmt()}, 'decode')}")
    return result | {"estimate": e.fmt(), "interval": [e.value, e.low, e.high]}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--served", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--out", type=Path, default=REPO / ".cache" / "bench-top-p")
    args = ap.parse_args()
    result: dict[str, Any] = {"op": op_alone(args.rounds)}
    if args.served:
        result["served"] = served(args.repetitions, args.requests, args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "top_p.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
