"""How many tokens a request needs to run for a given time on the machine at hand.

A fixed answer length is minutes on a loaded 2-core box and under a second on a fast CPU: tests that must catch
a request mid-flight (drain, disconnect) size their answers from the decode rate measured on the server itself.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx

SHORT_TOKENS, LONG_TOKENS = 16, 272


def _elapsed(url: str, model: str, concurrency: int, tokens: int, headers: dict[str, str]) -> float:
    body = {"model": model, "prompt": "hello world", "max_tokens": tokens, "ignore_eos": True}
    with ThreadPoolExecutor(concurrency) as pool:
        start = time.monotonic()
        for resp in pool.map(
            lambda _: httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=300),
            range(concurrency),
        ):
            assert resp.status_code == 200, resp.text[:300]
        return time.monotonic() - start


def per_stream_rate(url: str, model: str, concurrency: int, headers: dict[str, str] | None = None) -> float:
    """Tokens per second one of `concurrency` simultaneous completions gets once it decodes: the marginal rate
    of a long answer over a short one, so the fixed cost of a request (HTTP, prefill, first step) does not
    count as slow decoding (it made a 128-token probe read a quarter of the real rate)."""
    short = _elapsed(url, model, concurrency, SHORT_TOKENS, headers or {})
    long = _elapsed(url, model, concurrency, LONG_TOKENS, headers or {})
    marginal = long - short
    if marginal > long / 4:
        return (LONG_TOKENS - SHORT_TOKENS) / marginal
    # A noisy pair (the short one descheduled) leaves no margin: the plain, lower rate.
    return LONG_TOKENS / long


def tokens_for(seconds: float, rate: float, ceiling: int, floor: int = 512) -> int:
    """Answer length that decodes for about `seconds` at `rate`, within [floor, ceiling]."""
    return max(floor, min(ceiling, int(rate * seconds)))
