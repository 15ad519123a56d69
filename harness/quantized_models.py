"""Quantized copies of local bf16 models, by round-to-nearest, in compressed-tensors layout (no hub, no calibration
library): what the tests serve and what bench/parts/quant_kernels.py measures.

Schemes (all symmetric, as vLLM's CPU kernels need):
- "w8a8":        int8 per-output-channel weights, int8 dynamic per-token activations ("int-quantized" format)
- "w8a8-static": int8 per-output-channel weights, int8 static per-tensor activations (scales from a short
                 calibration pass of the bf16 model)
- "w4a16":       int4 weights, one scale per group of `group_size` input channels, bf16 activations
                 ("pack-quantized", 8 values per int32 with compressed-tensors' own packer)

A projection whose shape the scheme cannot cover (e.g. the demo model's down_proj, input 688: not a multiple of a
128 group nor of the 32 vLLM's generic int4 kernel needs) is left in bf16 and listed in the config's `ignore`,
as llm-compressor does. `corrupt_scale` multiplies every o_proj scale by that factor: a broken kernel's
stand-in for the quality checks.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from service.cache.atomic_dir import build_once

VERSION = "v1"  # bump when the recipe changes, so caches rebuild
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# vLLM runs these as one linear layer each (qkv_proj, gate_up_proj): its kernels see the summed output size.
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
CALIBRATION_TEXT = "the model answers a question about the cpu cache and the server thread. hello world."


@dataclass(frozen=True)
class Scheme:
    name: str
    weight_bits: int
    group_size: int | None  # None: one scale per output channel
    activations: str | None  # "dynamic" (per token), "static" (per tensor) or None (16-bit)

    def fits(self, in_features: int, out_features: int) -> bool:
        if self.weight_bits == 8:
            return True
        # int4: whole groups, and the 32-multiples vLLM's generic CPU int4 kernel (CPUWNA16) packs by.
        group_ok = self.group_size is None or in_features % self.group_size == 0
        return group_ok and in_features % 32 == 0 and out_features % 32 == 0


SCHEMES = {
    "w8a8": Scheme("w8a8", 8, None, "dynamic"),
    "w8a8-static": Scheme("w8a8-static", 8, None, "static"),
    "w4a16": Scheme("w4a16", 4, 128, None),
    # Groups of 64: every projection of SmolLM2-135M (hidden 576, not a multiple of 128) is quantized.
    "w4a16-g64": Scheme("w4a16-g64", 4, 64, None),
}


def _quant_config(scheme: Scheme, ignore: list[str]) -> dict:
    weights = {
        "num_bits": scheme.weight_bits,
        "type": "int",
        "symmetric": True,
        "strategy": "group" if scheme.group_size else "channel",
        "group_size": scheme.group_size,
        "dynamic": False,
        "actorder": None,
        "observer": "minmax",
    }
    activations = None
    if scheme.activations:
        dynamic = scheme.activations == "dynamic"
        activations = {
            "num_bits": 8,
            "type": "int",
            "symmetric": True,
            "strategy": "token" if dynamic else "tensor",
            "dynamic": dynamic,
            "observer": None if dynamic else "minmax",
        }
    fmt = "pack-quantized" if scheme.weight_bits == 4 else "int-quantized"
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": weights, "input_activations": activations, "format": fmt}
        },
        "ignore": ["lm_head", *ignore],
        "kv_cache_scheme": None,
    }


def _scales(weight, bits: int, group_size: int | None):
    """Symmetric round-to-nearest: (int8 values, scales of shape [out, groups])."""
    import torch

    qmax = 2 ** (bits - 1) - 1
    w = weight.float()
    out_f, in_f = w.shape
    groups = w.reshape(out_f, -1, group_size or in_f)
    scale = groups.abs().amax(dim=-1).clamp(min=1e-8) / qmax
    q = torch.clamp(torch.round(groups / scale[..., None]), -qmax - 1, qmax).to(torch.int8)
    return q.reshape(out_f, in_f), scale


def _activation_scales(source: Path, names: Iterable[str]) -> dict[str, float]:
    """max |input| / 127 of each projection over a short calibration text (bf16 model, transformers)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    wanted = set(names)
    model = AutoModelForCausalLM.from_pretrained(source, torch_dtype=torch.bfloat16)
    tokens = AutoTokenizer.from_pretrained(source)(CALIBRATION_TEXT * 4, return_tensors="pt")
    amax: dict[str, float] = {}
    hooks = []
    for name, module in model.named_modules():
        if name in wanted:

            def record(mod, args, name=name):
                amax[name] = max(amax.get(name, 0.0), float(args[0].abs().max()))

            hooks.append(module.register_forward_pre_hook(record))
    with torch.no_grad():
        model(**tokens)
    for h in hooks:
        h.remove()
    return {name: max(v, 1e-8) / 127 for name, v in amax.items()}


def _fused_out(state: dict, name: str) -> int:
    prefix, proj = name.rsplit(".", 1)
    siblings = next((group for group in FUSED if proj in group), (proj,))
    return sum(state[f"{prefix}.{p}.weight"].shape[0] for p in siblings if f"{prefix}.{p}.weight" in state)


def quantize(source: Path, dest: Path, scheme: Scheme, corrupt_scale: float | None = None) -> Path:
    """Write a compressed-tensors copy of the bf16 checkpoint at `source` into `dest`, once (service/cache/atomic_dir.py)."""
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from safetensors.torch import load_file, save_file

    state = {}
    for shard in sorted(source.glob("*.safetensors")):
        state.update(load_file(shard))
    linear = {k[: -len(".weight")] for k in state if k.endswith(".weight") and k.split(".")[-2] in PROJECTIONS}
    quantized = sorted(n for n in linear if scheme.fits(state[n + ".weight"].shape[1], _fused_out(state, n)))
    ignore = sorted(linear - set(quantized))
    act_scales = _activation_scales(source, quantized) if scheme.activations == "static" else {}

    out = {k: v for k, v in state.items() if k[: -len(".weight")] not in quantized}
    for name in quantized:
        q, scale = _scales(state[name + ".weight"], scheme.weight_bits, scheme.group_size)
        if corrupt_scale and name.endswith("o_proj"):
            scale = scale * corrupt_scale
        if scheme.weight_bits == 8:
            out[name + ".weight"] = q
            out[name + ".weight_scale"] = scale.to(torch.bfloat16)  # [out, 1]
        else:
            out[name + ".weight_packed"] = pack_to_int32(q, 4, packed_dim=1)
            out[name + ".weight_scale"] = scale.to(torch.bfloat16)  # [out, in / group]
            out[name + ".weight_shape"] = torch.tensor(list(q.shape), dtype=torch.int64)
        if name in act_scales:
            out[name + ".input_scale"] = torch.tensor([act_scales[name]], dtype=torch.bfloat16)

    def fill(staging: Path) -> None:
        for f in source.iterdir():
            if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
                shutil.copy2(f, staging / f.name)
        config = json.loads((source / "config.json").read_text())
        config["quantization_config"] = _quant_config(scheme, ignore)
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        save_file(
            {k: v.contiguous() for k, v in out.items()}, str(staging / "model.safetensors"), metadata={"format": "pt"}
        )

    build_once(dest, fill)
    return dest


def ensure_quantized(source: Path, scheme: str, corrupt_scale: float | None = None) -> Path:
    """The cached quantized copy of `source` (built once, beside it, safe under concurrent callers)."""
    suffix = f"-corrupt{corrupt_scale:g}" if corrupt_scale else ""
    dest = source.parent / f"{source.name}-{scheme}{suffix}-{VERSION}"
    if (dest / "config.json").is_file():
        return dest
    return quantize(source, dest, SCHEMES[scheme], corrupt_scale)


def quantized_demo(cache_dir: Path, scheme: str, corrupt_scale: float | None = None) -> Path:
    """The built-in demo model (service/models/demo_model.py), quantized."""
    from service.models.demo_model import ensure_demo_model

    return ensure_quantized(ensure_demo_model(cache_dir), scheme, corrupt_scale)


def quantized_bench(cache_dir: Path, scheme: str, corrupt_scale: float | None = None) -> Path:
    """The benchmark's ~0.5 B Llama (harness/models.py), quantized: the model bench/parts/quant_kernels.py and the
    service benchmark measure."""
    from harness.models import ensure_bench_model

    return ensure_quantized(ensure_bench_model(cache_dir), scheme, corrupt_scale)


def quantized_layers(directory: Path) -> frozenset[str]:
    """The projections of a quantized copy that hold quantized weights (module names)."""
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        return frozenset(k[: -len(".weight_scale")] for k in f.keys() if k.endswith(".weight_scale"))


def dynamic_int8_inputs(model, layers: frozenset[str], block: int | None = None) -> None:
    """What a W8A8 kernel does to each quantized projection's input: symmetric int8 per token (scale amax / 127),
    or per `block` inputs with the scale kept as fp16 (ggml's Q8_0 activations, the service's ggml int8 kernel), as
    forward pre-hooks on `model` (transformers), so a reference computes with the values the kernel sees."""
    import torch

    def fake_quant(_module, args):
        x = args[0]
        if block is None:
            scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127
            return (torch.clamp(torch.round(x / scale), -128, 127) * scale,)
        blocks = x.reshape(*x.shape[:-1], -1, block)
        scale = blocks.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127
        q = torch.clamp(torch.round(blocks / scale), -127, 127)
        return ((q * scale.half().to(x.dtype)).reshape(x.shape),)

    for name, module in model.named_modules():
        if name in layers:
            module.register_forward_pre_hook(fake_quant)


def dequantized_state(directory: Path) -> dict:
    """The bf16 weights a correct kernel computes with: each quantized projection's values times its scales
    (the reference for the quality checks, and a way to load the copy into transformers)."""
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from safetensors.torch import load_file

    state = load_file(str(directory / "model.safetensors"))
    out = {}
    for key, value in state.items():
        if key.endswith(".weight_packed"):
            name = key[: -len(".weight_packed")]
            shape = torch.Size(state[name + ".weight_shape"].tolist())
            q = unpack_from_int32(value, 4, shape, packed_dim=1).float()
        elif key.endswith(".weight") and value.dtype == torch.int8:
            name, q = key[: -len(".weight")], value.float()
        elif key.endswith((".weight_scale", ".weight_shape", ".input_scale")):
            continue
        else:
            out[key] = value
            continue
        scale = state[name + ".weight_scale"].float()
        group = q.shape[1] // scale.shape[1]
        out[name + ".weight"] = (
            (q.reshape(q.shape[0], -1, group) * scale[..., None]).reshape(q.shape).to(torch.bfloat16)
        )
    return out
