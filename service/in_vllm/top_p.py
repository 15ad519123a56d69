"""Top-p (with or without top-k) on the CPU without sorting the vocabulary.

vLLM 0.32's CPU sampler masks top-p by sorting every row of logits over the whole vocabulary, then a softmax, a
cumulative sum and a scatter back (`apply_top_k_top_p_pytorch`), at every step of every request that sends `top_p` or
whose model's generation config sets it: on one core, about a quarter of SmolLM2's decode step (the store's
claim/top-p-partial). A nucleus is far smaller than the vocabulary, so `top_k_top_p` takes the top n
by `topk` and keeps rank r where the probability mass of the ranks above it is below p (and r is within the row's
top-k): the tokens vLLM keeps, up to the order of exact ties. Where n tokens do not hold p of the mass (a flat
distribution), n grows; past `LIMIT` the batch goes to vLLM's sort. The plugin puts it in place of vLLM's function
in every vLLM process (the sampler and the rejection sampler import it by name).
"""

from __future__ import annotations

from typing import Any

FIRST = 64  # candidates taken first
LIMIT = 4096  # beyond, topk stops paying against one sort
GROWTH = 8  # 64, 512, 4096: a larger nucleus pays the cost of three topk calls at most


def top_k_top_p(logits: Any, k: Any, p: Any, sort: Any = None) -> Any:
    """`logits` (rows x vocab, float) with every token outside the row's top-k and top-p set to -inf; `k`, `p`:
    per-row tensors or None, as vLLM passes them. `sort`: vLLM's own function, for what this does not take."""
    import torch

    fallback = sort or _vllm_sort
    if p is None:  # top-k alone: vLLM's path takes topk already
        return fallback(logits, k, p)
    rows, vocab = logits.shape
    kk = torch.full((rows,), vocab, dtype=torch.long) if k is None else k.to(torch.long).clamp(1, vocab)
    limited = kk < vocab
    whole = (p >= 1) & ~limited  # p = 1 and no top-k in a mixed batch: the row stays as it is
    # A row with a top-k needs all its k tokens for the softmax that top-p is taken over.
    n = max(FIRST, int(kk[limited].max()) if bool(limited.any()) else 0)
    if n > LIMIT:
        return fallback(logits, k, p)
    every = torch.logsumexp(logits, dim=-1, keepdim=True)  # the normaliser of a row without top-k
    while True:
        n = min(n, vocab)
        values, index = logits.topk(n, dim=-1)  # descending
        in_k = torch.arange(n).unsqueeze(0) < kk.unsqueeze(1)
        within = values.masked_fill(~in_k, float("-inf"))
        norm = torch.where(limited.unsqueeze(1), torch.logsumexp(within, dim=-1, keepdim=True), every)
        probs = (within - norm).exp()
        mass = probs.cumsum(dim=-1)
        # rank n + 1 would be kept only where the n ranks above it hold less than p
        if n == vocab or bool((limited | whole | (mass[:, -1] >= p)).all()):
            break
        if n * GROWTH > LIMIT:
            return fallback(logits, k, p)
        n *= GROWTH
    keep = in_k & ((mass - probs < p.unsqueeze(1)) | whole.unsqueeze(1))
    keep[:, 0] = True  # the top token always (vLLM's "at least one")
    out = torch.full_like(logits, float("-inf"))
    out.scatter_(1, index, values.masked_fill(~keep, float("-inf")))
    if bool(whole.any()):
        out[whole] = logits[whole]
    return out


def _vllm_sort(logits: Any, k: Any, p: Any) -> Any:
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    return apply_top_k_top_p_pytorch(logits, k, p, allow_cpu_sync=True)


def use_partial_top_p(wanted: bool) -> str:
    """Put `top_k_top_p` in place of vLLM's top-k/top-p masking in this process; what became of it."""
    if not wanted:
        return "not asked"
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.sample.ops import topk_topp_sampler

    sort = topk_topp_sampler.apply_top_k_top_p
    if getattr(sort, "partial_top_p", False):  # a forked worker inherits the engine core's
        return "partial top-p"

    def masked(logits: Any, k: Any, p: Any) -> Any:
        return top_k_top_p(logits, k, p, sort)

    masked.partial_top_p = True  # type: ignore[attr-defined]
    topk_topp_sampler.apply_top_k_top_p = masked
    rejection_sampler.apply_top_k_top_p = masked
    return "partial top-p"
