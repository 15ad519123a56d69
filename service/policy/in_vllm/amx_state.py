"""Whether every vLLM process asks Linux for the AMX tile state before it computes.

Linux hands a process the AMX tile registers only after it asks (arch_prctl ARCH_REQ_XCOMP_PERM); a tile
instruction before that is an illegal instruction. oneDNN asks on its first AMX GEMM, vLLM 0.32 never does, yet its
CPU attention runs on tiles wherever torch sees `amx_tile` and the engine computes bf16
(`_get_attn_isa` in vllm/v1/attention/backends/cpu_attn.py). An engine whose first tile instruction is attention
(no oneDNN GEMM before it: linear layers on the service's kernels, or too small for oneDNN) lost its worker to
SIGILL on the first forward pass (measured: a 1-layer Qwen3 with hidden 64, bf16, on an AMX KVM guest).
The decision reaches vLLM's processes in AMX_STATE_ENV; the service's vLLM plugin asks there (service/in_vllm/amx_request.py).
"""

from __future__ import annotations

from service.facts.cpu import Isa
from service.in_vllm.contract import AMX_STATE_ENV
from service.policy.plan.decision import PolicyResult, env


def amx_state(isa: Isa) -> PolicyResult:
    if not isa.amx_tile:
        return PolicyResult()
    return PolicyResult.of(
        env(
            AMX_STATE_ENV,
            "1",
            "the CPU shows amx_tile, so vLLM's bf16 attention runs on AMX tiles, and vLLM never asks Linux for the "
            "tile state (arch_prctl ARCH_REQ_XCOMP_PERM): without a oneDNN GEMM asking first, the worker died of "
            "SIGILL on its first forward pass; the service's vLLM plugin asks in every vLLM process",
            "policy",
        )
    )
