"""The weight bytes one decode step reads, as the engine holds them: what bounds batch-1 decode on a CPU, and what
the quantized layers' kernel decision cites."""

from __future__ import annotations

from dataclasses import replace

from service.facts.model import DecodeReads, ModelFacts
from service.kernels.registry import KERNELS
from service.policy.engine.dtype import BYTES
from service.policy.gguf.model_source import held_as, kept_bytes, kept_heads
from service.policy.plan.decision import Decision, PolicyResult, record


def kernel_blocks(kernel: Decision | None) -> tuple[str, int] | None:
    """(kernel, bytes per 32 weights) where every quantized layer runs one kernel that holds them as blocks."""
    chosen = KERNELS.get(str(kernel.value)) if kernel is not None else None
    return (str(kernel.value), chosen.block_bytes) if kernel is not None and chosen and chosen.block_bytes else None


def read_per_token(
    model: ModelFacts,
    dtype: str,
    gguf_blocks: str | None = None,
    bf16_projections: bool = False,
    kernel_blocks: tuple[str, int] | None = None,
) -> tuple[Decision, ...]:
    """The weight bytes one decode step reads, as the engine holds them: what bounds batch-1 decode on a CPU.
    `gguf_blocks`: the type a GGUF file's linear layers keep, read as ggml's op holds them. `bf16_projections`: the
    service's bf16-weight kernel holds the decoder's projections in bf16 (engine.linear_weights). `kernel_blocks`:
    the quantized layers' kernel and the bytes per 32 weights it holds them in (kernel_blocks)."""
    reads = model.decode_reads
    stored = "quantized values and zero points as stored"
    if reads is not None and gguf_blocks and model.gguf is not None:
        stored_bytes, stored_elements = kept_bytes(model.gguf, per_token=True)
        reads = DecodeReads(model.gguf.read_per_token_elements - stored_elements, stored_bytes)
        head = [h.type_name for h in kept_heads(model.gguf) if h.read_per_token]
        stored = f"the file's {gguf_blocks} blocks" + (f" and its {head[0]} LM head" if head else "")
        held = held_as(model.gguf)
        stored += f" as ggml holds them ({'; '.join(held)})" if held else " as stored"
    if reads is None:
        return ()
    kept = bf16_projections and reads.projection_elements > 0 and BYTES[dtype] != BYTES["bfloat16"]
    total = reads.bytes_in(BYTES[dtype], BYTES["bfloat16"] if kept else None)
    blocks = kernel_blocks if reads.quantized_weights else None
    if blocks:
        name, block_bytes = blocks
        total = reads.bytes_as_blocks(BYTES[dtype], block_bytes, BYTES["bfloat16"] if kept else None)
        floats = reads.float_elements - reads.quantized_float_elements
        parts = [
            f"{reads.quantized_weights / 1e6:.1f} M quantized weights as {name} holds them ({block_bytes} bytes per 32 "
            f"weights, scales included)",
            *([_kept_projections(reads.projection_elements)] if kept else []),
            f"{(floats - (reads.projection_elements if kept else 0)) / 1e6:.1f} M other float values in {dtype}",
        ]
        if others := reads.packed_bytes - reads.quantized_packed_bytes:
            parts.append(f"{others / 1e6:.1f} MB of other integer tensors as stored")
    elif kept:
        others = reads.float_elements - reads.projection_elements
        parts = [f"{_kept_projections(reads.projection_elements)}, {others / 1e6:.1f} M other float values in {dtype}"]
    else:
        parts = [f"{reads.float_elements / 1e6:.1f} M float values (layers, scales) in {dtype}"]
    if reads.packed_bytes and not blocks:
        parts.insert(0, f"{reads.packed_bytes / 1e6:.1f} MB of {stored}")
    why = (
        f"one decode step reads {total / 1e6:.1f} MB of weights: {', '.join(parts)}; the input embedding table only "
        "where it is also the LM head (a step gathers one row of it); from the checkpoint's tensor headers"
    )
    return (record("model", "read_per_token", total, why, "policy"),)


def _kept_projections(elements: int) -> str:
    return (
        f"{elements / 1e6:.1f} M projection weights kept in bfloat16 by the service's kernel "
        "(if their values are bf16, as it checks at load)"
    )


def citing_reads(result: PolicyResult, reads: tuple[Decision, ...]) -> PolicyResult:
    """The kernel decision says how many bytes per token its kernel reads."""
    if not reads:
        return result
    cite = f"; reads {reads[0].value / 1e6:.1f} MB of weights per decode token (model.read_per_token)"
    return replace(
        result,
        decisions=tuple(
            replace(d, reason=d.reason + cite) if d.setting == "quant.linear_kernel" else d for d in result.decisions
        ),
    )
