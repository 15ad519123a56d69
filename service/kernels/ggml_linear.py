"""An int4 linear kernel the service hands to vLLM: ggml's CPU matrix multiplication, the kernels llama.cpp runs.
Built at setup from the llama.cpp source that the bench's peer also builds (`make kernels`: ggml_build.py), and
called through the torch op `service_ggml::linear` (ggml_linear.cpp), with a fake implementation so torch.compile
traces through it.

Symmetric int4 weights (compressed-tensors W4A16, GPTQ) are Q4_0 blocks already: the stored nibble minus 8, times a
scale per 32 inputs. So they go into ggml's layout at load without a float round trip: the nibbles are regrouped and
the group's scale is repeated for each of its 32-wide blocks, as fp16. ggml repacks Q4_0 for its 8x8 AVX2 / AVX-512
GEMV. Weights with zero points (AWQ, asymmetric W4A16) become Q4_1 blocks (scale and minimum -zero*scale), which ggml
does not repack: the op holds them as repacked Q4_0 plus an fp32 offset per block (ggml_linear.cpp). Activations are
quantized per 32-block to int8 by ggml, as llama.cpp does. From the row count the policy planned for the block type
and activation dtype on (prefill; `handover`) the op dequantizes the blocks instead and runs torch's GEMM. Each
tensor-parallel rank converts its own partition. The service's vLLM plugin registers the kernel in each vLLM process
(vLLM's `register_linear_kernel`) when the policy decided it (service/policy/linear/quant.py).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

from service.cache.verified import Unverified, open_verified
from service.facts.software import GGML_KERNEL_BUILT, KERNEL_FILES, ggml_kernel_built, kernel_record
from service.in_vllm.contract import HANDOVER_ENV
from service.kernels.int4_layer import groups_first, int4_kernel_base, to_input_packed
from service.kernels.registry import KERNELS, parse_handover
from service.measurements.store import row

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

KERNEL_NAME = KERNELS["ggml-q4_0"].vllm_class
BLOCK = 32  # inputs per ggml Q4_0 / Q4_1 block
Q4_0, Q4_1 = 2, 3  # ggml_type values (ggml.h)
# Outside an engine the policy planned (the bench's tools, tests): the tables of the first machines measured.
UNPLANNED = {
    "bfloat16": dict(row("ggml-handover/zen4/bfloat16").params["rows"]),
    "float32": dict(row("ggml-handover/zen2/float32").params["rows"]),
}


@functools.cache
def _tables(value: str) -> dict[str, dict[str, int]]:
    return parse_handover(value) if value else UNPLANNED


def planned_handover() -> dict[str, dict[str, int]] | None:
    """The tables this process's kernels read (HANDOVER_ENV), or None outside a planned engine."""
    value = os.environ.get(HANDOVER_ENV, "")
    return _tables(value) if value else None


def handover(type_name: str) -> dict[str, int]:
    """Activation dtype -> the row count from which the op hands `type_name` blocks to torch's GEMM (0: never), as
    the policy planned it for this engine (HANDOVER_ENV). Read when a layer loads: the apply path, which
    torch.compile traces, only looks it up (`dense_from`)."""
    return {dtype: rows.get(type_name, 0) for dtype, rows in _tables(os.environ.get(HANDOVER_ENV, "")).items()}


def dense_from(rows: Mapping[str, int], dtype: torch.dtype) -> int:
    """A layer's hand-over row count for activations of `dtype`; fp16 (unmeasured) takes bf16's."""
    return rows.get(str(dtype).removeprefix("torch."), rows["bfloat16"])


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """int32 words of eight 4-bit values (lowest nibble first) along the last dim -> uint8 values, eight times as
    many."""
    import torch

    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    nibbles = (packed.to(torch.int32).unsqueeze(-1) >> shifts) & 0xF
    return nibbles.reshape(*packed.shape[:-1], -1).to(torch.uint8)


def _per_block(groups: torch.Tensor, k: int) -> torch.Tensor:
    """[n, groups] -> [n, k / 32]: a group's value for each 32-wide block it covers."""
    return groups.repeat_interleave(k // BLOCK // groups.shape[1], dim=1)


def _nibbles(q: torch.Tensor) -> torch.Tensor:
    """[n, k] 4-bit values -> [n, k / 32, 16] bytes: element j of a block in the low nibble, j + 16 in the high."""
    import torch

    blocks = q.reshape(q.shape[0], -1, BLOCK)
    return (blocks[..., :16] | (blocks[..., 16:] << 4)).to(torch.uint8)


def fp16_bytes(values: torch.Tensor) -> torch.Tensor:
    import torch

    return values.to(torch.float16).contiguous().view(torch.uint8).reshape(*values.shape, 2)


def q4_0_blocks(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Unsigned nibbles [n, k] (value = nibble - 8) and scales [n, groups] -> ggml Q4_0 rows, uint8 [n, k / 32 * 18]:
    per block, the fp16 scale then 16 bytes of nibbles."""
    import torch

    n, k = q.shape
    return torch.cat([fp16_bytes(_per_block(scales, k)), _nibbles(q)], dim=-1).reshape(n, -1)


def q4_1_blocks(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """Nibbles [n, k] with zero points and scales [n, groups] (value = (nibble - zero) * scale) -> ggml Q4_1 rows,
    uint8 [n, k / 32 * 20]: per block, the fp16 scale, the fp16 minimum (-zero * scale), then the nibbles."""
    import torch

    n, k = q.shape
    scales = scales.float()
    minimum = -zeros.float() * scales
    head = [fp16_bytes(_per_block(scales, k)), fp16_bytes(_per_block(minimum, k))]
    return torch.cat([*head, _nibbles(q)], dim=-1).reshape(n, -1)


# The memfds the libraries were loaded from, open for the process's life: glibc knows a loaded library by its path
# (/proc/self/fd/<fd>), and a number closed and reused would name the one loaded before.
_LOADED: list[int] = []


@functools.cache
def available() -> bool:
    """Built and as recorded (asked once per process: each layer asks, and hashing the libraries takes milliseconds)."""
    return ggml_kernel_built() is not None


@functools.cache
def load_library() -> None:
    """The op library and ggml's, as their build recorded them (service/cache/verified.py), and the fake
    implementations torch.compile traces with (output shapes only)."""
    import torch

    _load_verified(GGML_KERNEL_BUILT)

    @torch.library.register_fake("service_ggml::linear")
    def _(x: torch.Tensor, handle: int, n: int, bias: torch.Tensor | None, dense_from: int) -> torch.Tensor:
        return x.new_empty((x.shape[0], n))

    @torch.library.register_fake("service_ggml::embedding")
    def _(ids: torch.Tensor, handle: int, k: int) -> torch.Tensor:
        return ids.new_empty((ids.shape[0], k), dtype=torch.float32)


def _load_verified(stamp: Path) -> None:
    """ggml's libraries, then the op library over them, each from the bytes checked against the build's record
    (`stamp`). Not through torch.ops.load_library: it resolves the path, and /proc/self/fd/<fd> resolves to the
    memfd's name, which is no file."""
    import ctypes

    try:
        fds = open_verified(stamp.parents[1], kernel_record(stamp), KERNEL_FILES)
    except Unverified as exc:
        raise Unverified(
            f"the service's kernels cannot be loaded: {exc}. Rebuild them (make kernels; an image rebuilds them at "
            "its next start)"
        ) from exc
    _LOADED.extend(fds)
    for fd in fds:
        ctypes.CDLL(f"/proc/self/fd/{fd}", mode=ctypes.RTLD_GLOBAL)


def blocks_of(layer_q: torch.Tensor, layer_s: torch.Tensor, layer_zp: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """A layer's int4 parameters (vLLM's, as the checkpoint stored them) -> ggml rows [out, bytes] and their type."""
    q = unpack_int4(to_input_packed(layer_q).t().contiguous())  # [out, in]
    scales = groups_first(layer_s).t()  # [out, groups]
    if layer_zp is None:
        return q4_0_blocks(q, scales), Q4_0
    zeros = unpack_int4(groups_first(layer_zp)).t()  # [groups, out] packed along out -> [out, groups]
    return q4_1_blocks(q, scales, zeros), Q4_1


@functools.cache
def kernel_class() -> type:
    """The MPLinearKernel subclass, built on demand (once): importing vLLM is for vLLM's processes only."""
    import torch

    class GgmlLinearKernel(int4_kernel_base()):  # type: ignore[misc]
        @classmethod
        def fits(cls, k: int, n: int, group: int) -> tuple[bool, str | None]:
            if k % BLOCK or group % BLOCK:
                return False, f"input size {k} and group size {group} must be multiples of ggml's 32-wide blocks"
            if not available():
                return False, "the service's ggml kernel is not built (make kernels)"
            return True, None

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            load_library()
            k, n = self.config.partition_weight_shape
            zp = getattr(layer, self.w_zp_name) if self.config.zero_points and self.w_zp_name else None
            with torch.no_grad():
                blocks, ggml_type = blocks_of(getattr(layer, self.w_q_name), getattr(layer, self.w_s_name), zp)
            parts = torch.get_num_threads()  # one slice per thread of this worker's pool
            layer.ggml_args = (torch.ops.service_ggml.load(blocks, ggml_type, k, n, parts), n)
            layer.ggml_handover = handover("Q4_0" if ggml_type == Q4_0 else "Q4_1")
            # The blocks live in ggml's buffer now; the checkpoint's tensors are dropped.
            for name in (self.w_q_name, self.w_s_name, self.w_zp_name):
                if name and getattr(layer, name, None) is not None:
                    setattr(layer, name, None)

        def apply_weights(
            self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
        ) -> torch.Tensor:
            return apply(layer, x, bias, dense_from(layer.ggml_handover, x.dtype))

    GgmlLinearKernel.__name__ = GgmlLinearKernel.__qualname__ = KERNEL_NAME
    return GgmlLinearKernel


def apply(layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None, dense_from: int) -> torch.Tensor:
    """A layer's loaded blocks (layer.ggml_args) times x, of any leading shape."""
    import torch

    handle, n = layer.ggml_args
    out = torch.ops.service_ggml.linear(x.reshape(-1, x.shape[-1]), handle, n, bias, dense_from)
    return out.reshape(*x.shape[:-1], n)


def hand_to_vllm(kernel: type, kind: str) -> None:
    """Add a kernel to vLLM's CPU candidates of `kind` ("mp": weight-only, "int8") in this process, once (vLLM's own
    registration API)."""
    from vllm.model_executor.kernels import linear
    from vllm.platforms import PlatformEnum

    if not available():
        raise ImportError("the service's ggml kernel is not built (make kernels)")
    possible = linear._POSSIBLE_KERNELS if kind == "mp" else linear._POSSIBLE_INT8_KERNELS
    if kernel not in possible.get(PlatformEnum.CPU, []):
        linear.register_linear_kernel(kernel, PlatformEnum.CPU, kind)


def register() -> None:
    hand_to_vllm(kernel_class(), "mp")
