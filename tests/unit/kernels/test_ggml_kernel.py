"""The service's ggml op (built by `make kernels`, part of setup) on small weights, against the exact dequantization:
ggml's int8-activation path (repacked Q4_0, Q4_1 as repacked Q4_0 plus its blocks' offsets, and Q8_0) and the prefill
path that dequantizes the (repacked) blocks and runs torch's GEMM."""

from __future__ import annotations

import pytest
import torch

from service.kernels.ggml_int8 import Q8_0, q8_0_blocks
from service.kernels.ggml_linear import Q4_0, Q4_1, load_library, q4_0_blocks, q4_1_blocks

pytestmark = pytest.mark.kernels

N, K, GROUP = 48, 256, 64  # N: whole 8-row groups per slice, so ggml repacks Q4_0


@pytest.fixture(scope="module")
def ops():
    load_library()
    return torch.ops.service_ggml


def _weight(kind: int):
    g = torch.Generator().manual_seed(1)
    q = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    scales = (torch.rand(N, K // GROUP, generator=g) * 0.02 + 0.001).to(torch.float16).float()
    zeros = torch.randint(0, 16, (N, K // GROUP), generator=g)
    if kind == Q4_0:
        return q4_0_blocks(q, scales), (q.float() - 8) * scales.repeat_interleave(GROUP, 1)
    if kind == Q8_0:
        q8 = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
        channel = scales[:, 0] / 16
        return q8_0_blocks(q8, channel), q8.float() * channel[:, None]
    dequant = (q.float() - zeros.repeat_interleave(GROUP, 1)) * scales.repeat_interleave(GROUP, 1)
    return q4_1_blocks(q, scales, zeros), dequant


@pytest.mark.parametrize("kind", [Q4_0, Q4_1, Q8_0])
@pytest.mark.parametrize("rows", [1, 5, 70])
@pytest.mark.parametrize("dense_from", [0, 1])
def test_both_paths_match_the_exact_dequantization(ops, kind, rows, dense_from):
    blocks, dequant = _weight(kind)
    handle = ops.load(blocks, kind, K, N, 2)
    assert ops.repacked(handle) == (kind in (Q4_0, Q4_1))
    x = torch.randn(rows, K, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    bias = torch.randn(N).to(torch.bfloat16)
    got = ops.linear(x, handle, N, bias, dense_from)
    expected = x.float() @ dequant.t() + bias.float()
    assert got.dtype == x.dtype and got.shape == (rows, N)
    # int8 activations (ggml) or bf16 weights (dense) round; a wrong nibble order or scale is far off
    err = ((got.float() - expected).abs().max() / expected.abs().max()).item()
    assert err < 0.02, err


def test_a_q4_1_weight_whose_offsets_fp32_cannot_hold_stays_q4_1(ops):
    """One block whose minimum m and scale d lie 2^20 apart: m + 8 * d is not an fp32, so the split into Q4_0 plus
    offsets would change that block's values. The weight stays plain Q4_1, and its lookup is still exact."""
    blocks, _ = _weight(Q4_1)
    first = blocks[0].clone()
    first[0:2] = torch.tensor([1.2345e-4], dtype=torch.float16).view(torch.uint8)
    first[2:4] = torch.tensor([1235.0], dtype=torch.float16).view(torch.uint8)
    blocks[0] = first
    handle = ops.load(blocks, Q4_1, K, N, 2)
    assert not ops.repacked(handle)
    d, m = first[0:4].view(torch.float16).float()
    nibbles = torch.cat([first[4:20] & 15, first[4:20] >> 4]).float()
    got = ops.embedding(torch.tensor([0]), handle, K)[0, :32]
    assert torch.equal(got, nibbles * d + m)
    x = torch.ones(1, K)
    y = ops.linear(x, handle, N, None, 0)
    row = ops.embedding(torch.tensor([0]), handle, K).sum().item()
    assert abs(y[0, 0].item() / row - 1) < 0.01  # ggml rounds the ones to int8 with an fp16 scale


def test_the_split_q4_1_lookup_is_the_blocks_exactly(ops):
    """n * d + m of every block, as stored: the repacked nibbles times d plus the fp32 offset m + 8 * d."""
    blocks, _ = _weight(Q4_1)
    handle = ops.load(blocks, Q4_1, K, N, 2)
    assert ops.repacked(handle)
    got = ops.embedding(torch.arange(N), handle, K)
    raw = blocks.view(N, K // 32, 20)
    d, m = (
        raw[..., 0:2].contiguous().view(torch.float16).float(),
        raw[..., 2:4].contiguous().view(torch.float16).float(),
    )
    nibbles = torch.cat([raw[..., 4:] & 15, raw[..., 4:] >> 4], dim=-1).float()
    assert torch.equal(got, (nibbles * d + m).reshape(N, K))
