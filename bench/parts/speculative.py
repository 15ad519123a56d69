"""Speculative decoding against none, side by side: the measurement `speculative=auto` rests on
(service/policy/engine/speculative.py).

  .venv/bin/python -m bench.parts.speculative [--repetitions 2] [--requests 3] [--max-tokens 128] [--concurrency 1 4]
                                       [--model FILE.gguf] [--peer] [--suffix] [--draft SETTING]

The default model is served twice at once, with the n-gram proposer and without, and answers the same chat requests
in adjacent requests, order alternating. With `--peer`, llama.cpp's server (`make bench-tools`) joins them twice, with
its prompt lookup and without, on the engine's cores, and both sides load the one GGUF file (the service with its own
choices on it, blocks kept where it keeps them). Two workloads: text that repeats its context (a licence an installed
package ships, copied; a standard-library function, edited; a package's metadata as a JSON tool result, summarised)
and free generation (a story, an explanation). Per workload and concurrency: completion tokens per second of wall
time, each ratio of RATIOS per request round, averaged as logs per repetition (a restart of all); and the n-gram
proposer's acceptance from the server's own `vllm:spec_decode_*` counters.

With `--suffix`, suffix decoding (arctic-inference) joins them, and with `--peer` so does llama.cpp's `ngram-mod`:
both remember earlier requests (suffix decoding's global tree holds past answers, ngram-mod's hash table outlives a
request), so each round after a start's first sees answers to the same prompts. The first round's ratios are kept
apart (`first_round`): what either gains before it has seen an answer.

With `--draft SETTING`, a third server of ours drafts with that `speculative` value (a draft model's directory, or
`eagle:<dir>`, an EAGLE head as `python -m bench.tools.eagle_head` trains one), measured against none (`draft/off`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import inspect
import json
import math
import statistics
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.stats import estimate
from harness import REPO, ServerProcess, offline_env
from harness.metrics import counter_totals

# Our service with the n-gram proposer and without; with --peer, llama.cpp's server on the same GGUF file with its own
# prompt lookup (ngram-simple, at its defaults: the setting its maintainers chose) and without.
VARIANTS = {"ngram": {"SERVICE_SPECULATIVE": "ngram"}, "off": {"SERVICE_SPECULATIVE": "off"}}
PEER_VARIANTS = {"llama.cpp-lookup": ("--spec-type", "ngram-simple"), "llama.cpp": ()}
# With --suffix: the method that remembers past answers, and llama.cpp's lookup that outlives a request.
SUFFIX_VARIANTS = {"suffix": {"SERVICE_SPECULATIVE": "suffix"}}
SUFFIX_PEER_VARIANTS = {"llama.cpp-ngram-mod": ("--spec-type", "ngram-mod")}
DRAFT = "draft"  # with --draft: our server drafting with the setting it names
DRAFTING = ("ngram", "suffix", DRAFT)  # our variants whose acceptance the counters give
# candidate/baseline: the proposer's gain on our side; then ours against llama.cpp, each with its drafting and without.
RATIOS = (
    ("ngram", "off"),
    ("ngram", "llama.cpp-lookup"),
    ("off", "llama.cpp"),
    ("llama.cpp-lookup", "llama.cpp"),
    ("suffix", "off"),
    ("suffix", "llama.cpp-ngram-mod"),
    ("llama.cpp-ngram-mod", "llama.cpp"),
    (DRAFT, "off"),
)
HEADLINE = "ngram/llama.cpp-lookup"  # what `make bench-peer` reports and promotes: each side with its drafting
SUFFIX_HEADLINE = "suffix/llama.cpp-ngram-mod"  # with --suffix: each side drafting from earlier requests too
CTX = 2048  # llama.cpp's context per slot: the longest request here (a licence quoted, 128 tokens out) with room
MAX_TOKENS = 128  # tokens per answer: long enough for a copy to settle into the lookup's matches
COUNTERS = ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total")


def workloads() -> dict[str, list[str]]:
    """User messages per workload, from text installed packages ship (not text written for the bench)."""
    licence = importlib.metadata.distribution("httpx").read_text("licenses/LICENSE.md") or ""
    code = inspect.getsource(textwrap.TextWrapper._split)
    metadata = json.dumps({k: v for k, v in importlib.metadata.metadata("httpx").json.items() if k != "description"})
    return {
        "repeated": [
            f"Copy this licence text exactly, word for word:\n\n{licence}",
            f"Rewrite this Python method with its parameter `text` renamed to `source`, changing nothing else:\n\n"
            f"{code}",
            f"A tool returned this JSON. List every field with its value, one per line:\n\n{metadata}",
        ],
        "free": [
            "Write a short story about a lighthouse keeper who finds a message in a bottle.",
            "Explain how a refrigerator keeps food cold, step by step.",
            "Describe a walk through a forest in autumn.",
        ],
    }


def fitted(loads: dict[str, list[str]], url: str, max_tokens: int, served: str = "bench") -> dict[str, list[str]]:
    """Each message with its quoted text cut until the prompt and `max_tokens` fit the model's context (the server's
    /tokenize counts the chat prompt): the bench model's 1 024 tokens hold less of a licence than SmolLM2's 8 192."""

    def tokens(content: str) -> tuple[int, int]:
        body = {"model": served, "messages": [{"role": "user", "content": content}]}
        resp = httpx.post(f"{url}/tokenize", json=body, timeout=60)
        resp.raise_for_status()
        return resp.json()["count"], resp.json()["max_model_len"]

    out: dict[str, list[str]] = {}
    for workload, messages in loads.items():
        out[workload] = []
        for message in messages:
            ask, _, text = message.partition("\n\n")
            count, limit = tokens(message)
            while count + max_tokens > limit and text:
                text = text[: int(len(text) * (limit - max_tokens) / count * 0.95)]
                message = f"{ask}\n\n{text}"
                count, limit = tokens(message)
            out[workload].append(message)
    return out


def counters(url: str) -> dict[str, float]:
    return dict.fromkeys(COUNTERS, 0.0) | counter_totals(url, "vllm:spec_decode_num_")


def throughput(url: str, messages: list[str], concurrency: int, max_tokens: int, served: str = "bench") -> float:
    """Completion tokens per second of wall time, `concurrency` requests at once, each message once per slot."""

    def one(content: str) -> int:
        body = {
            "model": served,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        resp = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=900)
        resp.raise_for_status()
        return int(resp.json()["usage"]["completion_tokens"])

    batch = [messages[i % len(messages)] for i in range(max(concurrency, len(messages)))]
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(one, batch))
    return tokens / (time.perf_counter() - start)


def start_all(
    base: dict[str, str],
    peer_file: Path | None,
    slots: int,
    log_dir: Path,
    rep: int,
    suffix: bool = False,
    llama_env: dict[str, str] | None = None,
    draft: str | None = None,
) -> dict[str, Any]:
    """Every variant's server, started in an order that alternates with `rep`; llama.cpp's on our engine's cores, with
    `llama_env` in their environment."""
    from bench.servers import Reported, llama_server

    ours = our_variants(suffix, draft)
    peers = PEER_VARIANTS | (SUFFIX_PEER_VARIANTS if suffix else {})
    started: dict[str, ServerProcess] = {}
    try:
        for variant in list(ours) if rep % 2 == 0 else list(ours)[::-1]:
            started[variant] = ServerProcess(
                base | ours[variant], log_dir / f"server-{variant}-{rep}.log", name=variant
            ).start()
            started[variant].wait_ready(900)
        if peer_file is not None:
            cpus = Reported.fetch(started["off"].url).engine_cpus
            for variant, extra in peers.items():
                log_path = log_dir / f"server-{variant}-{rep}.log"
                started[variant] = llama_server(
                    peer_file, cpus, slots, log_path, llama_env, extra=extra, ctx_per_slot=CTX
                ).start()
                started[variant].wait_ready(900)
    except BaseException:
        for server in started.values():
            server.close()
        raise
    return started


def measure(
    model: Path | None,
    cache_dir: Path,
    log_dir: Path,
    repetitions: int,
    requests: int,
    max_tokens: int,
    levels: list[int],
    peer_file: Path | None = None,
    suffix: bool = False,
    llama_env: dict[str, str] | None = None,
    draft: str | None = None,
) -> dict[str, Any]:
    """`model` None: the default model as `make serve` serves it. All servers run at once (a KV cache of 1 GiB each
    of ours) and answer one at a time. `peer_file`: the GGUF file llama.cpp's servers load (the one ours serves).
    `suffix`: suffix decoding and llama.cpp's ngram-mod join them. `llama_env`: llama.cpp's environment (the peer's
    repacking turned off where it crashed). `draft`: the `speculative` value of a third server of ours."""
    from bench.servers import SERVED

    log_dir.mkdir(parents=True, exist_ok=True)
    base = offline_env(drop=("SERVICE_", "LD_PRELOAD"))
    base.update(SERVICE_SERVED_MODEL_NAME="bench", SERVICE_CACHE_DIR=str(cache_dir), SERVICE_KV_CACHE_GIB="1")
    if model is not None:
        base.update(SERVICE_MODEL=str(model))
    loads = workloads()
    keys = [f"{w}/c{c}" for w in loads for c in levels]
    ours = list(our_variants(suffix, draft))
    variants = [*ours, *(PEER_VARIANTS if peer_file else ()), *(SUFFIX_PEER_VARIANTS if peer_file and suffix else ())]
    ratios: dict[str, dict[str, list[float]]] = {
        f"{a}/{b}": {k: [] for k in keys} for a, b in RATIOS if a in variants and b in variants
    }
    first_round: dict[str, dict[str, list[float]]] = {name: {k: [] for k in keys} for name in ratios}
    rates: dict[str, dict[str, list[float]]] = {k: {v: [] for v in variants} for k in keys}
    served = served_names(ours, variants, SERVED)
    accepted: dict[str, dict[str, list[float]]] = {m: {w: [] for w in loads} for m in DRAFTING if m in ours}
    trimmed: list[int] = []
    for rep in range(repetitions):
        started = start_all(base, peer_file, max(levels), log_dir, rep, suffix, llama_env, draft)
        try:
            for variant, server in started.items():  # first requests after start: not timed
                throughput(server.url, ["Say hello."], 1, 8, served[variant])
            if rep == 0:
                loads = fitted(loads, started["off"].url, max_tokens)
                trimmed = [len(a) - len(b) for a, b in zip(workloads()["repeated"], loads["repeated"])]
            for workload, messages in loads.items():
                before = {m: counters(started[m].url) for m in accepted}
                for c in levels:
                    key = f"{workload}/c{c}"
                    pairs: dict[str, list[float]] = {name: [] for name in ratios}
                    for i in range(requests):
                        got = {}
                        for variant in variants if i % 2 == 0 else variants[::-1]:
                            got[variant] = throughput(started[variant].url, messages, c, max_tokens, served[variant])
                            rates[key][variant].append(got[variant])
                        for name in ratios:
                            a, b = name.split("/")
                            pairs[name].append(got[a] / got[b])
                    for name, values in pairs.items():
                        ratios[name][key].append(math.exp(statistics.fmean(map(math.log, values))))
                        first_round[name][key].append(values[0])
                        print(f"rep {rep} {key} {name}: " + " ".join(f"{p:.3f}" for p in values), file=sys.stderr)
                for method, by_workload in accepted.items():
                    after = counters(started[method].url)
                    drafted = after[COUNTERS[0]] - before[method][COUNTERS[0]]
                    kept = after[COUNTERS[1]] - before[method][COUNTERS[1]]
                    by_workload[workload].append(kept / drafted if drafted else 0.0)
        finally:
            for server in started.values():
                server.close()
    from service.facts.hardware import read_hardware

    cpu = read_hardware().cpu
    return {
        "model": str(model) if model else "the default model (SmolLM2-135M-Instruct, as make serve serves it)",
        "peer_file": str(peer_file) if peer_file else None,
        "cpu": f"{cpu.vendor} {cpu.model_name} ({cpu.microarchitecture})",
        "max_tokens": max_tokens,
        "requests_per_start": requests,
        "characters_cut": trimmed,  # per repeated message, to fit the model's context
        "ratios": ratios,
        "estimates": {
            name: {k: estimate(f"{k} {name}", "ratio", v).fmt() for k, v in by.items()} for name, by in ratios.items()
        },
        "interval": {name: {k: _interval(v) for k, v in by.items()} for name, by in ratios.items()},
        "first_round": {name: {k: _interval(v) for k, v in by.items()} for name, by in first_round.items()},
        "median_tok_s": {k: {v: statistics.median(r) for v, r in by.items()} for k, by in rates.items()},
        "draft": draft,
        "acceptance": {w: statistics.fmean(a) for w, a in accepted["ngram"].items()},
        "acceptance_by_method": {m: {w: statistics.fmean(a) for w, a in by.items()} for m, by in accepted.items()},
    }


def our_variants(suffix: bool, draft: str | None) -> dict[str, dict[str, str]]:
    """Our servers' environments: n-gram and none, with suffix decoding and the `--draft` setting where asked."""
    return VARIANTS | (SUFFIX_VARIANTS if suffix else {}) | ({DRAFT: {"SERVICE_SPECULATIVE": draft}} if draft else {})


def served_names(ours: list[str], variants: list[str], peer: str) -> dict[str, str]:
    """Each server's model name: ours serve the bench's, llama.cpp's servers `peer`'s."""
    return {v: "bench" if v in ours else peer for v in variants}


def _interval(samples: list[float]) -> list[float]:
    e = estimate("", "ratio", samples)
    return [round(e.low if e.low is not None else e.value, 3), round(e.high if e.high is not None else e.value, 3)]


def main() -> None:
    from service.facts.model import packaged_default_model_path
    from service.settings import default_cache_dir

    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="default: the packaged default model (SmolLM2-135M-Instruct)")
    ap.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    ap.add_argument("--repetitions", type=int, default=2)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--peer", action="store_true", help="llama.cpp's server on the same GGUF file, lookup on and off")
    ap.add_argument(
        "--suffix", action="store_true", help="suffix decoding too (and llama.cpp's ngram-mod, with --peer)"
    )
    ap.add_argument(
        "--draft", help="a third server of ours drafting with this speculative value (eagle:<dir>, a directory)"
    )
    ap.add_argument("--out", type=Path, default=REPO / ".cache" / "bench-speculative")
    args = ap.parse_args()
    model = args.model or packaged_default_model_path()
    assert model, "no model: the default model's wheel is not installed"
    if args.peer and model.suffix != ".gguf":
        ap.error(f"--peer: llama.cpp loads a GGUF file, and {model} is not one")
    # --peer: the service loads the file llama.cpp loads (without --model, `make serve` serves the packaged file
    # dequantized, which llama.cpp's side would not match)
    result = measure(
        model if args.peer else args.model,
        args.cache_dir,
        args.out / "logs",
        args.repetitions,
        args.requests,
        args.max_tokens,
        args.concurrency,
        model if args.peer else None,
        args.suffix,
        draft=args.draft,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speculative.json").write_text(json.dumps(result, indent=2))
    for by in result["estimates"].values():
        for text in by.values():
            print(f"{result['cpu']}: {text}")
    for method, by in result["acceptance_by_method"].items():
        print(f"{method} acceptance (accepted / drafted): " + ", ".join(f"{w} {a:.2f}" for w, a in by.items()))
    for name, by in result["first_round"].items():
        print(f"first round {name}: " + ", ".join(f"{k} {lo:.3f}-{hi:.3f}" for k, (lo, hi) in by.items()))


if __name__ == "__main__":
    main()
