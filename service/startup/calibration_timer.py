"""Times the candidates of the calibration's questions (service/policy/plan/calibration.py) in this process, which the
calibration starts pinned like the engine's worker: `python -m service.startup.calibration_timer < request.json`.

Each int4 candidate is built the way vLLM builds it: a layer holding the checkpoint's int4 parameters (random, in
its layout), the kernel vLLM's `choose_mp_linear_kernel` picks under the candidate's environment (the service's own
registered first when the candidate names it), its `process_weights_after_loading` and `apply_weights`. A candidate
is checked against the reference matmul of the dequantized weights on the same inputs, warmed up, then timed in
rounds whose order rotates. Read bandwidth is probed before and after. Progress goes to stderr, the result (JSON)
to stdout.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from service.in_vllm.amx_request import request_amx_state
from service.in_vllm.contract import AMX_STATE_ENV, KERNELS_ENV
from service.kernels import register_kernels
from service.kernels.registry import KERNELS

MAX_REL_ERR = 0.05  # of the reference output's largest magnitude: 16-bit rounding and int8 activations pass, a
# wrong scale (x2) or layout does not
PROBE_BYTES = 256 << 20


def _param(data: torch.Tensor, input_dim: int, output_dim: int, packed_dim: int | None = None) -> torch.nn.Parameter:
    p = torch.nn.Parameter(data, requires_grad=False)
    p.input_dim, p.output_dim, p.packed_dim = input_dim, output_dim, packed_dim  # type: ignore[attr-defined]
    if packed_dim is not None:
        p.packed_factor = 8  # type: ignore[attr-defined]
    return p


def _pack(q: torch.Tensor, dim: int) -> torch.Tensor:
    """Eight 4-bit values per int32 along `dim`, lowest nibble first (GPTQ and compressed-tensors pack alike)."""
    q = q.to(torch.int32).movedim(dim, -1)
    q = q.reshape(*q.shape[:-1], -1, 8)
    packed = sum(q[..., i] << (4 * i) for i in range(8))
    return torch.as_tensor(packed).movedim(-1, dim).contiguous()


def _pack_awq(q: torch.Tensor) -> torch.Tensor:
    """AutoAWQ's packing: eight 4-bit values per int32 along the output dim (last), in AWQ's interleaved order."""
    from vllm.model_executor.layers.quantization.auto_awq import _REVERSE_AWQ_PACK_ORDER

    q = q.to(torch.int32).reshape(*q.shape[:-1], -1, 8)
    return sum(q[..., j] << (4 * nibble) for j, nibble in enumerate(_REVERSE_AWQ_PACK_ORDER)).contiguous()


@functools.cache
def _one_rank() -> None:
    """vLLM's distributed state for one rank of one: its parameter classes (the AWQ conversion's) read the rank."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    with set_current_vllm_config(VllmConfig()):
        init_file = tempfile.mktemp(prefix="calibration-rank-")
        init_distributed_environment(1, 0, f"file://{init_file}", 0, backend="gloo")
        initialize_model_parallel(1, 1)


def _int4_layer(question: dict[str, Any], k: int, n: int, dtype: torch.dtype) -> tuple[Any, Any, torch.Tensor]:
    """The config vLLM's kernels are chosen by, the layer, and the dequantized weight [K, N] in fp32."""
    from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import MPLinearLayerConfig
    from vllm.scalar_type import scalar_types

    group = question["group_size"] or k
    groups = k // group
    sym = question["symmetric"]
    q = torch.randint(0, 16, (k, n))
    scales = torch.rand(groups, n) * 0.02 + 0.001
    zeros = torch.full((groups, n), 8) if sym else torch.randint(0, 16, (groups, n))
    dequant = (q - zeros.repeat_interleave(group, 0)).float() * scales.to(dtype).float().repeat_interleave(group, 0)
    layer = torch.nn.Module()
    if question["layout"] == "awq":  # qweight [K, N/8], scales [G, N], qzeros [G, N/8], AWQ's order
        params = (_param(_pack_awq(q), 0, 1, 1), _param(scales.to(dtype), 0, 1), _param(_pack_awq(zeros), 0, 1, 1))
    elif question["layout"] == "gptq":  # qweight [K/8, N], scales [G, N], qzeros [G, N/8]
        params = (
            _param(_pack(q, 0), 0, 1, 0),
            _param(scales.to(dtype), 0, 1),
            _param(_pack(zeros, 1), 0, 1, 1),
        )
    else:  # compressed-tensors: weight_packed [N, K/8], weight_scale [N, G], weight_zero_point [N/8, G]
        params = (
            _param(_pack(q.t(), 1), 1, 0, 1),
            _param(scales.t().contiguous().to(dtype), 1, 0),
            _param(_pack(zeros.t(), 0), 1, 0, 0),
        )
    for name, p in zip(("w_q", "w_s", "w_zp"), params, strict=True):
        layer.register_parameter(name, p)
    layer.bias = None  # as vLLM's linear layers carry it (AMX W4A8 reads it)
    if question["layout"] == "awq":  # what vLLM's AutoAWQ method does at load, before its kernel's own repacking
        from vllm.model_executor.layers.quantization.auto_awq import _convert_awq_to_standard_format

        _one_rank()
        _convert_awq_to_standard_format(layer, "w_q", "w_zp", 4)
    group_size = question["group_size"] or -1
    wtype = scalar_types.uint4b8 if sym else scalar_types.uint4
    config = MPLinearLayerConfig((k, n), (k, n), wtype, dtype, group_size, not sym)
    return config, layer, dequant


def _int4_runner(question: dict[str, Any], candidate: dict[str, Any], k: int, n: int) -> tuple[Callable, str, Any]:
    """apply(x) for one shape under the candidate's environment, the kernel class vLLM chose, the reference weight."""
    from vllm.model_executor.kernels.linear import choose_mp_linear_kernel

    _use_env(candidate)
    dtype = getattr(torch, question["act_dtype"])
    config, layer, dequant = _int4_layer(question, k, n, dtype)
    cls = choose_mp_linear_kernel(config)
    # Named for symmetric checkpoints too, as vLLM's compressed-tensors, GPTQ and AWQ methods do: AMX W4A8 puts its
    # implied zero points there.
    kernel = cls(config, "w_q", "w_s", "w_zp")
    kernel.process_weights_after_loading(layer)
    return (lambda x: kernel.apply_weights(layer, x, None)), cls.__name__, dequant


def _int8_runner(question: dict[str, Any], candidate: dict[str, Any], k: int, n: int) -> tuple[Callable, str, Any]:
    """A W8A8 layer (per-channel int8 weights, dynamic symmetric per-token activations) through the kernel vLLM's
    `init_int8_linear_kernel` picks under the candidate's environment."""
    from vllm.model_executor.kernels.linear import init_int8_linear_kernel

    _use_env(candidate)
    weight = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    scale = torch.rand(n, 1) * 0.002 + 0.0005
    layer = torch.nn.Module()
    layer.weight = _param(weight, 1, 0)  # [N, K], as the checkpoint stores it
    layer.weight_scale = _param(scale, 1, 0)
    layer.input_scale = layer.input_zero_point = layer.azp_adj = None
    layer.logical_widths = [n]
    layer.bias = None
    kernel = init_int8_linear_kernel(True, False, True, "calibration")
    kernel.process_weights_after_loading(layer)
    return (lambda x: kernel.apply_weights(layer, x, None)), type(kernel).__name__, (weight.float() * scale).t()


def _use_env(candidate: dict[str, Any]) -> None:
    """The candidate's environment in place of the last one's (vLLM reads these when it picks and prepares). A
    service kernel an earlier candidate registered stays in vLLM's list for this process: disabled unless named."""
    for name in ("VLLM_CPU_INT4_W4A8", "VLLM_DISABLED_KERNELS", "VLLM_ZENTORCH_WEIGHT_PREPACK"):
        os.environ.pop(name, None)
    os.environ.update(candidate["env"])
    named = candidate["env"].get(KERNELS_ENV, "")
    others = {k.vllm_class for k in KERNELS.values() if k.provider} - set(named.split(","))
    disabled = [k for k in os.environ.get("VLLM_DISABLED_KERNELS", "").split(",") if k]
    os.environ["VLLM_DISABLED_KERNELS"] = ",".join([*disabled, *sorted(others)])
    register_kernels(named)


def _dense_runner(question: dict[str, Any], candidate: dict[str, Any], k: int, n: int) -> tuple[Callable, str, Any]:
    """An unquantized linear layer set up as vLLM's UnquantizedLinearMethod does at load (its CPU GEMM dispatch:
    oneDNN, zentorch, torch; or the service's bf16 kernel where the candidate's environment names it), in the
    candidate's dtype. The weights are bf16 values, as a bf16 checkpoint's are in either engine dtype."""
    from vllm.model_executor.layers import utils

    from service.kernels import bf16_linear

    _use_env(candidate)
    dispatch = utils.dispatch_cpu_unquantized_gemm
    if bf16_linear.KERNEL.vllm_class not in candidate["env"].get(KERNELS_ENV, "").split(","):
        dispatch = getattr(dispatch, "wrapped", dispatch)  # registered for an earlier candidate of this process
    dtype = getattr(torch, candidate["settings"].get("dtype", question["act_dtype"]))
    layer = torch.nn.Module()
    weight = (torch.randn(n, k) * 0.02).to(torch.bfloat16).to(dtype)
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    reference = weight.float().t().clone()
    dispatch(layer, remove_weight=True)  # as vLLM's linear method calls it (the service's kernel takes only this)
    linear = layer.cpu_linear
    by = "the service's bf16 kernel" if linear is bf16_linear.linear else "vLLM's CPU GEMM dispatch"
    return (lambda x: linear(x, layer.weight, None)), f"{by}, {dtype}", reference


def _read_bandwidth() -> float:
    """GB/s of one pass summing a buffer far larger than the caches (best of three)."""
    buf = torch.ones(PROBE_BYTES // 4)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - start)
    return PROBE_BYTES / best / 1e9


def _time(passes: list[Callable[[], Any]], reps: int, blocks: int = 1) -> float:
    """Seconds per pass: the best of `blocks` blocks of `reps` passes (a block a neighbour interrupted is not the
    kernel's speed)."""
    best = float("inf")
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(reps):
            for run in passes:
                run()
        best = min(best, (time.perf_counter() - start) / reps)
    return best


def _why(exc: Exception) -> str:
    """The exception, and where it was raised when it says nothing itself (a bare `assert` in a kernel)."""
    said = str(exc)
    if not said and (frames := traceback.extract_tb(exc.__traceback__)):
        said = f"at {Path(frames[-1].filename).name}:{frames[-1].lineno}"
    return f"{type(exc).__name__}: {said}"[:300]


def time_question(question: dict[str, Any], rounds: int, prefill_m: int, log: Callable[[str], None]) -> dict[str, Any]:
    torch.manual_seed(0)
    dtype = getattr(torch, question.get("act_dtype") or "float32")
    built: dict[str, tuple[list, list]] = {}
    results: dict[str, dict[str, Any]] = {}
    for candidate in question["candidates"]:
        name = candidate["name"]
        log(f"building {name}")
        try:
            decode, prefill, worst, classes = [], [], 0.0, set()
            for k, n in question["shapes"]:
                if question["weights"] in ("int4", "int8"):
                    runner = _int4_runner if question["weights"] == "int4" else _int8_runner
                    apply, cls, ref_w = runner(question, candidate, k, n)
                    act = dtype
                else:
                    apply, cls, ref_w = _dense_runner(question, candidate, k, n)
                    act = getattr(torch, candidate["settings"].get("dtype", question["act_dtype"]))
                classes.add(cls)
                x = torch.randn(prefill_m, k).to(act)
                out = apply(x).float()
                ref = x.float() @ ref_w
                worst = max(worst, ((out - ref).abs().max() / ref.abs().max()).item())
                x1, xm = x[:1].contiguous(), x
                decode.append(lambda apply=apply, x1=x1: apply(x1))
                prefill.append(lambda apply=apply, xm=xm: apply(xm))
            results[name] = {"candidate": name, "max_rel_err": worst, "kernel_class": sorted(classes)}
            if worst > MAX_REL_ERR:
                results[name]["error"] = f"wrong results: max error {worst:.3f} of the reference's largest output"
                continue
            built[name] = (decode, prefill)
        except Exception as exc:  # a candidate that cannot be built here is excluded, with why
            results[name] = {"candidate": name, "error": _why(exc)}
    # Enough decode repetitions for blocks of ~7 ms (three per round), from one warm-up pass.
    reps = {}
    for name, (decode, prefill) in built.items():
        _time(prefill, 1)
        reps[name] = max(1, min(100, int(0.007 / max(_time(decode, 2), 1e-6))))
    names = list(built)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)] if names else []
        for name in order:
            log(f"timing {name}")
            decode, prefill = built[name]
            results[name].setdefault("decode_s", []).append(_time(decode, reps[name], blocks=3))
            results[name].setdefault("prefill_s", []).append(_time(prefill, 1))
        log(f"calibration {question['decision']}: round {r + 1}/{rounds}")
    return {"decision": question["decision"], "timings": list(results.values())}


def main() -> None:
    request = json.load(sys.stdin)
    # A kernel on AMX tiles (vLLM's WNA16 and W4A8 on AMX) needs the tile state that vLLM's processes get from the
    # service's plugin: this process is not one of them.
    request_amx_state(os.environ.get(AMX_STATE_ENV) == "1")

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    before = _read_bandwidth()
    answers = [time_question(q, request["rounds"], request["prefill_m"], log) for q in request["questions"]]
    after = _read_bandwidth()
    print(json.dumps({"answers": answers, "bandwidth_gb_s": [round(before, 1), round(after, 1)]}), flush=True)


if __name__ == "__main__":
    main()
