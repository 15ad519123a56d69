"""The service's expand kernel (service/in_vllm/rejection_sampler.py) against what vLLM's Triton kernel computes,
and against the C++ fallback it replaces, which leaves a float output unwritten."""

from __future__ import annotations

import torch

from service.in_vllm.rejection_sampler import expand


def test_each_requests_value_is_repeated_over_its_tokens_in_the_outputs_dtype():
    temperatures = torch.tensor([0.5, -1.0, 0.7])  # -1: a greedy request's marker, replaced by 1
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    out = torch.full((6,), float("nan"))
    expand(out, temperatures, cu, -1.0, 1.0)
    assert out.tolist() == [0.5, 0.5, 1.0, 1.0, 1.0, 0.699999988079071]


def test_integer_values_and_requests_without_tokens():
    top_k = torch.tensor([5, 0, 9], dtype=torch.int32)
    cu = torch.tensor([1, 1, 3], dtype=torch.int32)
    out = torch.empty(3, dtype=torch.int32)
    expand(out, top_k, cu, 0, 0)
    assert out.tolist() == [5, 9, 9]


def test_the_cpu_fallback_it_replaces_leaves_a_float_output_unwritten():
    from vllm.platforms import current_platform
    from vllm.utils import cpu_triton_utils

    # vLLM's own pick of its op library for this CPU (the AVX-512 BF16, AVX-512 or AVX2 build): `vllm._C` itself
    # aborts the process on a CPU without AVX-512 BF16.
    current_platform.import_kernels()

    fallback = cpu_triton_utils._expand_kernel_impl
    assert fallback is not expand  # the plugin replaces it only in vLLM's processes
    out = torch.full((3,), float("nan"))
    fallback(out, torch.tensor([0.5, 0.7]), torch.tensor([1, 3]), -1, 1)
    assert torch.isnan(out).all()  # when vLLM fixes it, this fails: the service's replacement can go
