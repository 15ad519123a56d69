"""Whether a model ends its answer to an agent's request, under a sampling setting: the measurement the default
model's sampling default rests on (service/policy/engine/sampling.py).

  .venv/bin/python -m bench.tools.agent_stop [--samples 6] [--cap 1024] [--request bench/requests/claude-code-2.1.332-first.json]

The request is Claude Code's first of a `-p` turn, recorded as it reached the service (its system prompt, its tool
list, `max_tokens` 32000, no temperature). It is sent to the default model as `make serve` runs it (a server of its
own, the policy's sampling default turned off), `--samples` times per setting, each answer capped at `--cap` tokens:
an answer that ends (`end_turn`) before the cap counts. Neither agent client sends a temperature, so what the server
samples with by default decides whether a turn ends or writes on to the end of the context.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import httpx

from harness import REPO, ServerProcess, offline_env

REQUEST = REPO / "bench" / "requests" / "claude-code-2.1.332-first.json"
# vLLM's default (temperature 1, nothing else), llama.cpp's server's defaults, and greedy.
SETTINGS: dict[str, dict[str, Any]] = {
    "vLLM's default (temperature 1)": {},
    "llama-server's defaults": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05},
    "greedy": {"temperature": 0.0},
}


def ended(url: str, body: dict[str, Any], samples: int) -> list[tuple[str, int, float]]:
    """(stop reason, output tokens, seconds) of each sample."""
    answers = []
    for _ in range(samples):
        started = time.monotonic()
        reply = httpx.post(f"{url}/v1/messages", json=body, timeout=1800)
        reply.raise_for_status()
        answer = reply.json()
        answers.append((answer["stop_reason"], answer["usage"]["output_tokens"], time.monotonic() - started))
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--cap", type=int, default=1024)
    parser.add_argument("--request", type=Path, default=REQUEST)
    args = parser.parse_args()
    body = json.loads(args.request.read_text()) | {"stream": False, "max_tokens": args.cap}
    env = offline_env() | {"SERVICE_DEFAULT_SAMPLING": "off", "SERVICE_KV_CACHE_GIB": "1"}
    server = ServerProcess(env, REPO / ".cache" / "bench-agent-stop.log", name="default").start()
    try:
        server.wait_ready()
        results = {}
        for name, sampling in SETTINGS.items():
            answers = ended(server.url, body | sampling, args.samples)
            count = sum(reason == "end_turn" for reason, _, _ in answers)
            results[name] = {"ended": count, "samples": args.samples, "answers": answers}
            print(f"{name}: {count} of {args.samples} answers ended before {args.cap} tokens: {answers}", flush=True)
        print(json.dumps({"request": str(args.request), "cap": args.cap, "results": results}))
    finally:
        server.kill_group()


if __name__ == "__main__":
    main()
