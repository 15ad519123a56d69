"""Runs the GGUF check (service/policy/gguf/gguf_check.py) against the engine once it is up, before /ready turns 200: the
converted tokenizer on llama.cpp's fixed text, and one prompt-scoring request of llama.cpp's token ids (a prefill of
64 tokens, the cost of a short request). It runs at every start of a converted file, since the engine it checks
(kernels, backend, dtype) can change between starts while llama.cpp's scores, kept with the copy, cannot."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

from service.models.llama_cpp_reference import REFERENCE
from service.policy.gguf.gguf_check import CheckVerdict, Mode, judge

log = logging.getLogger("service.gguf")


class GgufCheckRefused(RuntimeError):
    """The engine's answers on the file are not llama.cpp's: the start is refused."""


async def check_gguf(engine: Any, converted: Path, mode: Mode) -> CheckVerdict:
    """The verdict on the converted copy at `converted`, logged; raises GgufCheckRefused when it refuses."""
    try:
        reference = json.loads((converted / REFERENCE).read_text())
    except (OSError, ValueError) as exc:
        reference = {"unavailable": f"no reference scores in the converted copy ({exc})"}
    logprobs = tokens = top = None
    if mode != "off" and "unavailable" not in reference:
        tokenizer = engine.get_tokenizer()
        tokens = list(tokenizer.encode(reference["text"]))
        logprobs, top = await _scores(engine, reference["tokens"])
    verdict = judge(reference, logprobs, tokens, mode, top)
    if not verdict.ok:
        raise GgufCheckRefused(f"GGUF check against llama.cpp: {verdict.reason}")
    level = logging.INFO if verdict.passed else logging.WARNING
    said = {True: "passed: ", False: "FAILED: ", None: ""}[verdict.passed]  # a check not run says so itself
    log.log(level, "GGUF check against llama.cpp %s%s", said, verdict.reason)
    return verdict


async def _scores(engine: Any, tokens: list[int]) -> tuple[list[float], list[int]]:
    """The engine's log-probability of each of `tokens` after the first, and its top token there."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1)
    final = None
    async for output in engine.generate(TokensPrompt(prompt_token_ids=tokens), params, f"gguf-check-{uuid.uuid4()}"):
        final = output
    if final is None or final.prompt_logprobs is None:
        raise RuntimeError("the engine returned no prompt scores for the GGUF check")
    logprobs, top = [], []
    for token, scored in zip(tokens[1:], list(final.prompt_logprobs)[1:]):
        logprobs.append(float(scored[token].logprob))
        top.append(next(t for t, lp in scored.items() if lp.rank == 1))
    return logprobs, top
