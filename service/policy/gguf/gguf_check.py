"""The start-up check of a GGUF file's conversion: whether the engine scores llama.cpp's fixed text as llama.cpp does
on the same file (service/models/llama_cpp_reference.py), and what the service does when it does not.

Both sides are handed the same token ids, so the scores differ only by the weights' mapping, the kernels and the
engine's arithmetic. The check compares the log-probability each side gives the text's next token, position by
position: the mean absolute difference against MEAN_BOUND. The tokenizer is compared on its own: the converted
tokenizer must split the text into llama.cpp's ids, or every request is read differently from llama.cpp."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from service.measurements.store import cite

Mode = Literal["refuse", "warn", "off"]

# Nats, the mean over the text's positions: above the noise of K-quant files on ggml's kernels and of bf16 copies
# (claim/gguf-check-agreement), below the subtlest wrong conversion measured, a rope base lost (claim/gguf-check-fault).
MEAN_BOUND = 0.2


@dataclass(frozen=True)
class CheckVerdict:
    ok: bool  # the service may serve: the check passed, was not run, or only warns
    passed: bool | None  # None: not run
    reason: str


def judge(
    reference: dict[str, Any],
    engine_logprobs: list[float] | None,
    engine_tokens: list[int] | None,
    mode: Mode,
    engine_top: list[int] | None = None,
) -> CheckVerdict:
    """`reference`: llama.cpp's (REFERENCE in the converted copy); `engine_logprobs`: the engine's log-probability of
    each of the reference's tokens after the first; `engine_tokens`: the converted tokenizer's ids for its text;
    `engine_top`: the engine's top token at each of those positions (shown beside llama.cpp's)."""
    if mode == "off":
        return CheckVerdict(True, None, "not run: gguf_check=off; the answers are not compared with llama.cpp's")
    if "unavailable" in reference:
        return CheckVerdict(True, None, f"not run: llama.cpp could not score the file ({reference['unavailable']})")
    problem = _problem(reference, engine_logprobs or [], engine_tokens or [], engine_top)
    if problem is None:
        return CheckVerdict(True, True, _figures(reference, engine_logprobs or [], engine_top))
    if mode == "warn":
        return CheckVerdict(True, False, f"{problem}; served anyway (gguf_check=warn)")
    return CheckVerdict(False, False, f"{problem}; gguf_check=warn serves it anyway")


def _problem(
    reference: dict[str, Any], engine: list[float], engine_tokens: list[int], top: list[int] | None
) -> str | None:
    tokens = reference["tokens"]
    if engine_tokens[: len(tokens)] != tokens:
        at = next(
            (i for i, (a, b) in enumerate(zip(engine_tokens, tokens)) if a != b), min(len(engine_tokens), len(tokens))
        )
        return (
            f"the converted tokenizer splits the check's text differently from llama.cpp on the same file (token {at}: "
            f"{engine_tokens[at : at + 3]} against llama.cpp's {tokens[at : at + 3]})"
        )
    expected = reference["logprobs"]
    if len(engine) != len(expected):
        return f"the engine scored {len(engine)} positions of the check's text, llama.cpp {len(expected)}"
    mean = _mean_difference(expected, engine)
    if mean > MEAN_BOUND:
        return (
            f"the engine's answers differ from llama.cpp's on the same file: {_figures(reference, engine, top)}, beyond the "
            f"bound of {MEAN_BOUND} nat ({cite('claim/gguf-check-agreement')}); the conversion of this file is wrong"
        )
    return None


def _mean_difference(expected: list[float], engine: list[float]) -> float:
    return sum(abs(a - b) for a, b in zip(expected, engine)) / max(1, len(expected))


def _figures(reference: dict[str, Any], engine: list[float], top: list[int] | None) -> str:
    expected = reference["logprobs"]
    worst = max((abs(a - b) for a, b in zip(expected, engine)), default=0.0)
    same = "" if top is None else f"; the top token the same at {sum(a == b for a, b in zip(top, reference['top']))}"
    return (
        f"next-token log-probabilities over {len(expected)} positions of a fixed text differ from llama.cpp's by "
        f"{_mean_difference(expected, engine):.3f} on average (at most {worst:.3f}){same}"
        + ("" if top is None else f" of {len(expected)}")
    )
