"""The service's top-p masking (service/in_vllm/top_p.py) keeps the tokens vLLM's sort keeps, and hands back to
the sort what it does not take."""

from __future__ import annotations

import pytest
import torch
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

from service.in_vllm import top_p
from service.in_vllm.top_p import top_k_top_p

VOCAB = 49152


def vllms(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    return apply_top_k_top_p_pytorch(logits.clone(), k, p, allow_cpu_sync=True)


def kept(masked: torch.Tensor) -> list[set[int]]:
    return [set(torch.nonzero(row > float("-inf")).flatten().tolist()) for row in masked]


def peaked(rows: int, scale: float, seed: int) -> torch.Tensor:
    """Logits as a language model's at a chat temperature: a few likely tokens over a long flat tail."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, VOCAB, generator=g) * scale


@pytest.mark.parametrize("scale", [2.0, 4.0, 8.0])
@pytest.mark.parametrize("p", [0.5, 0.9, 0.95])
def test_the_nucleus_is_the_tokens_vllms_sort_keeps(scale, p):
    logits = peaked(4, scale, seed=int(scale * 10 + p * 100))
    ps = torch.full((4,), p)
    ours = top_k_top_p(logits.clone(), None, ps, vllms)
    assert kept(ours) == kept(vllms(logits, None, ps))
    # a kept token keeps its logit
    assert torch.equal(ours[ours > float("-inf")], logits[ours > float("-inf")])


def test_top_k_and_top_p_together_per_row():
    """Each row its own k (the vocabulary: no top-k) and p; top-p over the softmax of the row's top-k."""
    logits = peaked(4, 3.0, seed=7)
    k = torch.tensor([20, VOCAB, 5, 1000])
    p = torch.tensor([0.8, 0.9, 0.99, 0.7])
    assert kept(top_k_top_p(logits.clone(), k, p, vllms)) == kept(vllms(logits, k, p))


def test_a_flat_row_grows_the_candidates_and_a_flatter_one_goes_to_the_sort():
    calls = []

    def sort(logits, k, p):
        calls.append(1)
        return vllms(logits, k, p)

    # scale 2.5: the nucleus holds a few hundred tokens, more than the first 64
    grown = peaked(2, 2.5, seed=3)
    ps = torch.full((2,), 0.5)
    assert kept(top_k_top_p(grown.clone(), None, ps, sort)) == kept(vllms(grown, None, ps))
    assert calls == [] and top_p.FIRST < len(kept(vllms(grown, None, ps))[0]) <= top_p.LIMIT
    flat = peaked(2, 0.1, seed=4)  # near uniform: half the mass is half the vocabulary
    assert kept(top_k_top_p(flat.clone(), None, ps, sort)) == kept(vllms(flat, None, ps))
    assert calls == [1]


def test_p_of_one_in_a_mixed_batch_keeps_that_row_whole():
    logits = peaked(2, 4.0, seed=5)
    p = torch.tensor([1.0, 0.9])
    ours = top_k_top_p(logits.clone(), None, p, vllms)
    assert torch.equal(ours[0], logits[0])
    assert kept(ours)[1] == kept(vllms(logits, None, p))[1]


def test_top_k_alone_is_left_to_vllm():
    logits = peaked(1, 2.0, seed=6)
    sentinel = torch.zeros(1)
    assert top_k_top_p(logits, torch.tensor([5]), None, lambda *a: sentinel) is sentinel
