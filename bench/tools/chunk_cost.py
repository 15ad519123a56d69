"""CPU time to build one streamed chat chunk as vLLM's server does, with vLLM's response models as they ship
against the service's (service/server/openai_compat/response_models.py: without the request-side validator).

`python -m bench.tools.chunk_cost`: each repetition runs both variants in fresh processes, in alternating order, and pairs
them; prints the ratio (service / vLLM) with its 95% interval and writes `.cache/bench-chunk/chunk_cost.json`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.stats import estimate

OUT = Path(".cache/bench-chunk/chunk_cost.json")
VARIANTS = ("vllm", "service")


def chat_chunk() -> str:
    """One token's chunk of a streamed chat answer, built the way vLLM 0.32's chat serving builds it."""
    from vllm.entrypoints.generate.base.protocol import DeltaMessage
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionResponseStreamChoice,
        ChatCompletionStreamResponse,
    )

    choice = ChatCompletionResponseStreamChoice(
        index=0, delta=DeltaMessage(content=" token"), logprobs=None, finish_reason=None, token_ids=None
    )
    chunk = ChatCompletionStreamResponse(
        id="chatcmpl-0123456789abcdef", object="chat.completion.chunk", created=1, choices=[choice], model="m"
    )
    return chunk.model_dump_json(exclude_unset=True)


def completion_chunk() -> str:
    """One token's chunk of a streamed completion (what the front-end bench's client asks for)."""
    from vllm.entrypoints.openai.completion.protocol import CompletionResponseStreamChoice, CompletionStreamResponse

    choice = CompletionResponseStreamChoice(
        index=0,
        text=" token",
        logprobs=None,
        finish_reason=None,
        stop_reason=None,
        prompt_token_ids=None,
        token_ids=None,
    )
    chunk = CompletionStreamResponse(
        id="cmpl-0123456789abcdef", object="text_completion", created=1, model="m", choices=[choice]
    )
    return chunk.model_dump_json(exclude_unset=True)


KINDS = {"chat": chat_chunk, "completion": completion_chunk}


def time_variant(variant: str, chunks: int) -> dict[str, tuple[float, str]]:
    """Per kind of chunk: CPU microseconds per chunk (best of 5 rounds, this process only) and the chunk's JSON."""
    if variant == "service":
        from service.server.openai_compat.response_models import drop_request_validator

        drop_request_validator()
    measured = {}
    for kind, build in KINDS.items():
        text = build()
        best = float("inf")
        for _ in range(5):
            start = time.process_time()
            for _ in range(chunks):
                build()
            best = min(best, (time.process_time() - start) / chunks)
        measured[kind] = (best * 1e6, text)
    return measured


def _child(variant: str, chunks: int) -> dict[str, tuple[float, str]]:
    code = (
        "import json, sys; from bench.tools.chunk_cost import time_variant; "
        f"print(json.dumps(time_variant({variant!r}, {chunks})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600)
    return {kind: (us, text) for kind, (us, text) in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=6)
    parser.add_argument("--chunks", type=int, default=20000)
    args = parser.parse_args(argv)
    runs: list[dict[str, Any]] = []
    ratios: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for rep in range(args.repetitions):
        order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]
        measured = {variant: _child(variant, args.chunks) for variant in order}
        us = {kind: {variant: measured[variant][kind][0] for variant in VARIANTS} for kind in KINDS}
        for kind in KINDS:
            if measured["service"][kind][1] != measured["vllm"][kind][1]:
                raise SystemExit(
                    f"the {kind} chunks differ: {measured['service'][kind][1]} != {measured['vllm'][kind][1]}"
                )
            ratios[kind].append(us[kind]["service"] / us[kind]["vllm"])
        runs.append({"order": list(order), "us_per_chunk": us})
        print(
            f"repetition {rep + 1}: "
            + "; ".join(
                f"{kind} vllm {us[kind]['vllm']:.2f} us, service {us[kind]['service']:.2f} us" for kind in KINDS
            ),
            flush=True,
        )
    estimates = {kind: estimate(f"{kind}_chunk_cpu", "ratio", ratios[kind]) for kind in KINDS}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {"runs": runs, "ratios": {k: e.fmt() for k, e in estimates.items()}, "chunks": args.chunks}, indent=2
        )
    )
    for kind, e in estimates.items():
        print(f"{kind} chunk build CPU, service / vLLM response models: {e.fmt()} (95% interval, {e.n} pairs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
