"""The int4 and int8 checkpoint -> ggml block conversions of the service's ggml kernels (service/kernels/ggml_linear.py,
ggml_int8.py), checked against gguf-py's own dequantizer of those blocks (llama.cpp's reference layout), without
building ggml."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from service.kernels.ggml_int8 import q8_0_blocks
from service.kernels.ggml_linear import blocks_of, q4_0_blocks, q4_1_blocks, unpack_int4

N, K, GROUP = 64, 256, 64


def _dequantized(blocks: torch.Tensor, kind: GGMLQuantizationType) -> torch.Tensor:
    return torch.from_numpy(np.array(dequantize(blocks.numpy(), kind))).reshape(N, K)


def _values():
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    scales = (torch.rand(N, K // GROUP, generator=g) * 0.01 + 0.001).to(torch.float16).float()
    zeros = torch.randint(0, 16, (N, K // GROUP), generator=g)
    return q, scales, zeros


def _pack(q: torch.Tensor) -> torch.Tensor:
    """Eight values per int32 along the last dim, lowest nibble first (compressed-tensors and GPTQ)."""
    q = q.to(torch.int32).reshape(*q.shape[:-1], -1, 8)
    return sum(q[..., i] << (4 * i) for i in range(8))


def test_unpacking_inverts_the_int4_packing():
    q, _, _ = _values()
    assert torch.equal(unpack_int4(_pack(q)), q)


def test_symmetric_int4_becomes_q4_0_blocks_exactly():
    q, scales, _ = _values()
    expected = (q.float() - 8) * scales.repeat_interleave(GROUP, 1)
    assert torch.equal(_dequantized(q4_0_blocks(q, scales), GGMLQuantizationType.Q4_0), expected)


def test_int4_with_zero_points_becomes_q4_1_blocks():
    q, scales, zeros = _values()
    expected = (q.float() - zeros.repeat_interleave(GROUP, 1)) * scales.repeat_interleave(GROUP, 1)
    got = _dequantized(q4_1_blocks(q, scales, zeros), GGMLQuantizationType.Q4_1)
    # the minimum is stored as fp16: -zero * scale rounds
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=0)


def test_int8_weights_become_q8_0_blocks_as_stored():
    g = torch.Generator().manual_seed(3)
    q = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    scales = (torch.rand(N, generator=g) * 0.01 + 0.001).to(torch.float16).float()  # fp16-exact: no rounding
    got = _dequantized(q8_0_blocks(q, scales), GGMLQuantizationType.Q8_0)
    assert torch.equal(got, q.float() * scales[:, None])


def _param(data: torch.Tensor, input_dim: int, output_dim: int, packed_dim: int | None) -> torch.nn.Parameter:
    p = torch.nn.Parameter(data, requires_grad=False)
    p.input_dim, p.output_dim, p.packed_dim = input_dim, output_dim, packed_dim
    return p


@pytest.mark.parametrize("layout", ["compressed-tensors", "gptq"])
def test_a_layers_parameters_in_either_layout_give_the_same_blocks(layout):
    """compressed-tensors stores [out, in / 8] and [out, groups]; GPTQ the transposes."""
    q, scales, zeros = _values()
    if layout == "compressed-tensors":
        weight, s = _param(_pack(q), 1, 0, 1), _param(scales, 1, 0, None)
        zp = _param(_pack(zeros.t().contiguous()).t().contiguous(), 1, 0, 0)
    else:
        weight, s = _param(_pack(q).t().contiguous(), 0, 1, 0), _param(scales.t(), 0, 1, None)
        zp = _param(_pack(zeros.t().contiguous()), 0, 1, 1)
    blocks, kind = blocks_of(weight, s, None)
    assert kind == 2 and torch.equal(blocks, q4_0_blocks(q, scales))
    blocks, kind = blocks_of(weight, s, zp)
    assert kind == 3 and torch.equal(blocks, q4_1_blocks(q, scales, zeros))
