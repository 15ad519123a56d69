"""The rejection sampler's expand kernel on CPU, as vLLM's Triton kernel computes it, in torch.

vLLM 0.32's CPU platform replaces the rejection sampler's Triton kernels with C++ fallbacks (registered through
vllm/utils/cpu_triton_utils.py). Its `_expand_kernel_impl` hands the C++ kernel int64 copies of its tensors, so where
the output is a float tensor (the per-token temperatures and top-p values of `expand_batch_to_tokens`) the kernel
writes into a copy and the output keeps whatever `new_empty` left in it: every sampled request with drafted tokens
divided its logits by garbage (the store's claim/cpu-rejection-sampler/zen4; tests/integration/test_speculative.py
holds the comparison). Greedy requests never reach it. The function below takes the fallback's place in every vLLM
process where speculative decoding is on: the service's plugin sets it on cpu_triton_utils before the platform
registers its fallbacks (vllm/v1/worker/worker_base.py loads the general plugins first).
"""

from __future__ import annotations

from typing import Any


def expand(
    output: Any,
    input_val: Any,
    cu_num_tokens: Any,
    replace_from: float,
    replace_to: float,
    MAX_NUM_TOKENS: Any = None,  # noqa: N803 (the kernel's own parameter name)
) -> None:
    """Each request's value repeated over its tokens (cu_num_tokens: cumulative counts), `replace_from` as
    `replace_to`, in the output's own dtype."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    expanded = values.repeat_interleave(counts)
    output[: expanded.shape[0]].copy_(expanded.to(output.dtype))


def use_torch_expand(wanted: bool) -> str:
    """Put `expand` in place of vLLM's C++ fallback in this process; what became of it."""
    if not wanted:
        return "not asked"
    from vllm.utils import cpu_triton_utils

    cpu_triton_utils._expand_kernel_impl = expand
    return "torch expand"
