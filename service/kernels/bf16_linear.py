"""The service's kernel for the unquantized linear layers of a model on a CPU without native bf16 (AVX2, AVX-512
without its bf16 extension): the weights are bf16 in memory and widened to fp32 in registers (bf16_linear.cpp, op
`service_bf16::linear`, built with the ggml kernel by `make kernels`). In an fp32 engine they stay bf16, half the
bytes each decode step reads; in a bf16 engine the kernel replaces vLLM's GEMM, which converts bf16 in software.

It takes vLLM's own unquantized GEMM dispatch (`dispatch_cpu_unquantized_gemm`, which each linear layer calls once
at load) in the vLLM processes where the service's plugin registers it. A layer whose fp32 weights are not exactly
bf16 values (a checkpoint trained or stored in fp32 or fp16) keeps vLLM's fp32 GEMM: the kernel changes no result.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

from service.kernels.ggml_linear import available
from service.kernels.ggml_linear import load_library as load_kernels
from service.kernels.registry import KERNELS
from service.measurements.store import row

if TYPE_CHECKING:
    import torch

# A child of the plugin's logger, whose handler is the only one in vLLM's engine core and workers.
log = logging.getLogger("service.in_vllm.plugin.bf16_weights")
KERNEL = KERNELS["bf16-weights"]
# From this many rows on, the weight is widened chunk by chunk and multiplied by torch's fp32 GEMM: the first row
# count where that won on 1 and 2 threads, per activation dtype (the store's rows, cited by key).
DENSE_FROM_ROWS = {
    dtype: rows
    for key in ("claim/bf16-weights-handover/zen4", "claim/bf16-weights-handover/emeraldrapids")
    for dtype, rows in row(key).params["rows"].items()
}


@functools.cache
def load_library() -> None:
    import torch

    load_kernels()

    @torch.library.register_fake("service_bf16::linear")
    def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dense_from: int) -> torch.Tensor:
        return x.new_empty((x.shape[0], weight.shape[0]))


def bf16_exact(weight: torch.Tensor) -> torch.Tensor | None:
    """The weight as bf16 when every value is one exactly, else None."""
    import torch

    narrowed = weight.to(torch.bfloat16)
    return narrowed.contiguous() if torch.equal(narrowed.float(), weight) else None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    import torch

    dense_from = DENSE_FROM_ROWS[str(x.dtype).removeprefix("torch.")]
    out = torch.ops.service_bf16.linear(x.reshape(-1, x.shape[-1]), weight, bias, dense_from)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def register() -> None:
    """Take vLLM's unquantized GEMM dispatch in this process: bf16 linear weights, and fp32 ones that are bf16 values,
    run here."""
    import torch
    from vllm.model_executor.layers import utils

    if not available():
        raise ImportError("the service's kernels are not built (make kernels)")
    original = utils.dispatch_cpu_unquantized_gemm
    if hasattr(original, "wrapped"):  # once per process
        return
    load_library()
    said: set[tuple[torch.dtype, bool]] = set()

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        weight = layer.weight
        # Linear layers only (vLLM removes their weight; embeddings and tied heads keep theirs for the lookup).
        if (
            remove_weight
            and not weight.is_meta
            and weight.ndim == 2
            and weight.dtype in (torch.float32, torch.bfloat16)
        ):
            narrowed = weight.data.contiguous() if weight.dtype == torch.bfloat16 else bf16_exact(weight.data)
            outcome = (weight.dtype, narrowed is not None)
            if outcome not in said:  # the first layer of each outcome, per process
                said.add(outcome)
                how = (
                    "not bf16 values, left to vLLM in fp32"
                    if narrowed is None
                    else "kept bf16, run by the service's kernel"
                    + (" (fp32 arithmetic, bf16 output)" if weight.dtype == torch.bfloat16 else "")
                )
                log.info("%s layer %s %s", KERNEL.log_markers[0], tuple(weight.shape), how)
            if narrowed is not None:
                layer.weight = torch.nn.Parameter(narrowed, requires_grad=False)
                layer.cpu_linear = linear
                return
        original(layer, remove_weight)

    dispatch.wrapped = original  # type: ignore[attr-defined]  # vLLM's own, for a caller that must bypass this
    utils.dispatch_cpu_unquantized_gemm = dispatch
