"""How many tokens a request needs to run for a given time on the machine at hand.

A fixed answer length is minutes on a loaded 2-core box and under a second on a fast CPU: tests that must catch
a request mid-flight (drain, disconnect) size their answers from the decode time measured on the server itself.
A token costs more the later it comes (attention reads the whole context): on a fast CPU a demo-model stream
decoded several times slower thousands of positions into an answer than near its start, so an answer sized from
the first rate alone ran several times longer than it was meant to. The time per token is therefore measured near
the start and FAR_CONTEXT positions in, and taken to grow linearly in between and beyond.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

SHORT_TOKENS, LONG_TOKENS = 16, 272
FAR_CONTEXT = 2048
PROMPT = "hello world"


def _elapsed(
    url: str, model: str, concurrency: int, tokens: int, headers: dict[str, str], prompt: str | list[int]
) -> float:
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "ignore_eos": True}
    with ThreadPoolExecutor(concurrency) as pool:
        start = time.monotonic()
        for resp in pool.map(
            lambda _: httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=300),
            range(concurrency),
        ):
            assert resp.status_code == 200, resp.text[:300]
        return time.monotonic() - start


def _seconds_per_token(
    url: str, model: str, concurrency: int, headers: dict[str, str], prompt: str | list[int]
) -> float:
    """Per token of one of `concurrency` simultaneous completions once it decodes: the marginal time of a long answer
    over a short one, so the fixed cost of a request (HTTP, prefill, first step) does not count as slow decoding (it
    made a 128-token probe read a quarter of the real rate). The prompt is sent once before, so both answers find
    it in the prefix cache alike."""
    _elapsed(url, model, 1, 1, headers, prompt)
    short = _elapsed(url, model, concurrency, SHORT_TOKENS, headers, prompt)
    long = _elapsed(url, model, concurrency, LONG_TOKENS, headers, prompt)
    marginal = long - short
    if marginal > long / 4:
        return marginal / (LONG_TOKENS - SHORT_TOKENS)
    # A noisy pair (the short one descheduled) leaves no margin: the plain, slower figure.
    return long / LONG_TOKENS


@dataclass(frozen=True)
class StreamTiming:
    """Seconds per token of one of `concurrency` streams near the start of an answer, and `far_context` positions
    later (a prompt of that many tokens)."""

    near_s: float
    far_s: float
    far_context: int

    @property
    def growth(self) -> float:
        """Extra seconds per token per position (never negative: noise must not make long answers look cheap)."""
        return max(0.0, (self.far_s - self.near_s) / self.far_context)

    def seconds(self, tokens: int) -> float:
        """Time to decode `tokens` from the start of an answer: the per-token time summed over the positions."""
        return tokens * self.near_s + self.growth * tokens * tokens / 2

    def tokens_for(self, seconds: float, ceiling: int, floor: int = 512) -> int:
        """Answer length that decodes for about `seconds`, within [floor, ceiling]."""
        g = self.growth
        n = seconds / self.near_s if g == 0 else (math.sqrt(self.near_s**2 + 2 * g * seconds) - self.near_s) / g
        return max(floor, min(ceiling, int(n)))


def stream_timing(
    url: str, model: str, concurrency: int, max_context: int, headers: dict[str, str] | None = None
) -> StreamTiming:
    """Measured on the server; `max_context` is the server's max_model_len (the far prompt and its answer fit)."""
    far = min(FAR_CONTEXT, max_context - LONG_TOKENS - 16)
    # Token ids past the special ones, within any tokenizer's first 2000 ids.
    far_prompt = [100 + i % 1900 for i in range(far)]
    near_s = _seconds_per_token(url, model, concurrency, headers or {}, PROMPT)
    far_s = _seconds_per_token(url, model, concurrency, headers or {}, far_prompt)
    return StreamTiming(near_s, far_s, far)
