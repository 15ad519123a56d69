"""vLLM 0.32's CPU LoRA ops, with base-model tokens left alone (carried out in every vLLM process by the plugin).

A token of a request without an adapter has LoRA index -1 ("no LoRA"). vLLM's GPU kernels skip it; its pure-torch
ops, which the CPU platform uses (vllm/lora/ops/torch_ops/lora_ops.py), gather `weights[-1]`: the last adapter slot.
In a batch that mixes base-model requests with an adapter's, the base-model ones then got that adapter's delta: on
the demo model a base request's greedy text took the adapter's first token (vllm#48421, open). These are vLLM's
three gathering ops with those tokens' delta zero, and the others' computed one matmul per adapter in place of one
per token. The `sgmv_*` prefill ops call the module's `bgmv_*`, so replacing those covers them.
"""

from __future__ import annotations

import torch

FIXED = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
_MARK = "_cpu_llm_service_no_lora_rows"


def _deltas(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each token's input times its adapter's weights, zero for a token without one (-1): one matmul per adapter in the
    batch, none for a batch without adapters. vLLM's ops gather a copy of the weights for every token and multiply
    them one by one, many times slower at a prefill and at a decode step alike (claim/lora-ops/xeon-amx)."""
    if weights.dim() == 4:
        weights = weights.squeeze(dim=1)
    x = inputs.to(dtype=dtype)
    slots = [slot for slot in torch.unique(indices).tolist() if slot >= 0]
    if len(slots) == 1 and bool((indices == slots[0]).all()):
        return x @ weights[slots[0]].to(dtype=dtype).T
    outputs = x.new_zeros(x.shape[0], weights.shape[1])
    for slot in slots:
        rows = indices == slot
        outputs[rows] = x[rows] @ weights[slot].to(dtype=dtype).T
    return outputs


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    outputs = _deltas(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs[:]


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    outputs = _deltas(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    # LoRA adapter and model may add different amounts of padding to output (vLLM's comment)
    common_len = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common_len] += outputs[:limit, :common_len]
    else:
        output_tensor[:, :common_len] = outputs[:limit, :common_len]


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    outputs = _deltas(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs[:]
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs[:]


def apply_lora_rows_fix(needed: bool) -> str:
    """Puts the three ops in vLLM's module, and in the CPU punica wrapper that imported them by name."""
    if not needed:
        return "not needed"
    from vllm.lora.ops import torch_ops
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    if getattr(lora_ops, _MARK, False):
        return "already applied"
    ours = globals()
    for module in (lora_ops, torch_ops, punica_cpu):
        for name in FIXED:
            setattr(module, name, ours[name])
    setattr(lora_ops, _MARK, True)
    return "applied"
