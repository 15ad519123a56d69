"""The service's bf16-weight kernel (bf16_linear.cpp, built by `make kernels`) against fp32's own GEMM on the same
values: its GEMV and its widen-then-GEMM path compute fp32 products, so they agree to fp32 rounding (bf16
activations: to the one rounding of the output to bf16); a weight that is not bf16 values is left to vLLM."""

from __future__ import annotations

import pytest
import torch

from service.kernels.bf16_linear import DENSE_FROM_ROWS, bf16_exact, linear, load_library

pytestmark = pytest.mark.kernels

N, K = 200, 320
FP32_DENSE = DENSE_FROM_ROWS["float32"]


@pytest.fixture(scope="module")
def op():
    load_library()
    return torch.ops.service_bf16.linear


@pytest.mark.parametrize("rows", [1, 3, FP32_DENSE, 40])
@pytest.mark.parametrize("dense_from", [0, FP32_DENSE])
def test_both_paths_compute_fp32_products_of_the_bf16_weights(op, rows, dense_from):
    g = torch.Generator().manual_seed(4)
    weight = (torch.randn(N, K, generator=g) * 0.05).to(torch.bfloat16)
    x, bias = torch.randn(rows, K, generator=g), torch.randn(N, generator=g)
    got = op(x, weight, bias, dense_from)
    expected = torch.nn.functional.linear(x, weight.float(), bias)
    assert got.dtype == torch.float32 and got.shape == (rows, N)
    # fp32 sums in another order; a bf16-rounded activation would be ~1e-3 off
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 3, DENSE_FROM_ROWS["bfloat16"], 40])
def test_a_bf16_engines_activations_get_fp32_products_and_one_rounding(rows):
    """Both paths (GEMV below DENSE_FROM_ROWS["bfloat16"], widen-then-GEMM from it) widen the bf16 activations and
    weights, sum in fp32 and round the output to bf16 once: what a bf16 GEMM with fp32 accumulation returns."""
    load_library()
    g = torch.Generator().manual_seed(6)
    weight = (torch.randn(N, K, generator=g) * 0.05).to(torch.bfloat16)
    x, bias = torch.randn(2, rows, K, generator=g).to(torch.bfloat16), torch.randn(N, generator=g).to(torch.bfloat16)
    got = linear(x, weight, bias)
    expected = torch.nn.functional.linear(x.float(), weight.float(), bias.float()).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == (2, rows, N)
    # one bf16 rounding apart at most (fp32 sums in another order can round the other way)
    torch.testing.assert_close(got.float(), expected.float(), rtol=2**-7, atol=1e-6)


def test_only_weights_that_are_bf16_values_are_narrowed():
    exact = torch.randn(8, 32).to(torch.bfloat16).float()
    assert torch.equal(bf16_exact(exact).float(), exact)
    assert bf16_exact(exact + 1e-6) is None


def test_the_dense_path_splits_across_threads_under_inference_mode(op):
    """vLLM runs the model under torch.inference_mode(). A rank with more than one OpenMP thread (a server with more
    cores than this test machine's one compute core) computes the dense path's chunks on threads that must work in
    the caller's mode: the output, made in it, refuses a copy_ from outside it."""
    g = torch.Generator().manual_seed(5)
    weight = (torch.randn(1100, K, generator=g) * 0.05).to(torch.bfloat16)  # three 512-row chunks
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.inference_mode():
            x = torch.randn(FP32_DENSE, K, generator=g)
            got = op(x, weight, None, FP32_DENSE)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(got, x @ weight.float().T, rtol=1e-5, atol=1e-5)
